"""Seeded train/validation split and balanced per-class subsets."""
from __future__ import annotations

import numpy as np

from fkjax.data.types import DataError
from fkjax.data.types import Split


def take(split: Split, indices: np.ndarray) -> Split:
  """The examples of `split` at `indices`, in that order."""
  return Split(split.images[indices], split.labels[indices])


def limit(split: Split, num_examples: int) -> Split:
  """The first ``num_examples`` of ``split`` (all of it for 0)."""
  if num_examples and num_examples < len(split.labels):
    return Split(split.images[:num_examples], split.labels[:num_examples])
  return split


def train_val_split(split: Split, val_size: int,
                    seed: int) -> tuple[Split, Split]:
  """Splits off a fixed random validation set (the paper's 45K/5K split).

  The choice of validation examples depends only on `seed`, `val_size` and
  the number of examples, so every run and every source that yields the same
  official train set in the same order gets the same split. Both parts keep
  the original file order.

  Args:
    split: the official training set.
    val_size: number of validation examples, 0 <= val_size < N.
    seed: seed of the permutation that picks the validation examples.

  Returns:
    (train, val).
  """
  n = split.num_examples
  if not 0 <= val_size < n:
    raise ValueError(f"val_size must be in [0, {n}) for {n} training "
                     f"examples, got {val_size}")
  perm = np.random.default_rng(seed).permutation(n)
  val_idx = np.sort(perm[:val_size])
  train_idx = np.sort(perm[val_size:])
  return take(split, train_idx), take(split, val_idx)


def subset_per_class(split: Split, per_class: int, num_classes: int,
                     where: str) -> Split:
  """The first `per_class` examples of every class, in the original order.

  Raises:
    DataError: when some class has fewer than `per_class` examples, since a
      silently unbalanced subset would skew every accuracy measured on it.
  """
  if per_class <= 0:
    raise ValueError(f"per_class must be positive, got {per_class}")
  counts = np.bincount(split.labels, minlength=num_classes)
  short = np.flatnonzero(counts < per_class)
  if short.size:
    c = int(short[0])
    raise DataError(
        f"{where}: cannot take {per_class} examples per class; class {c} has "
        f"only {int(counts[c])} ({short.size} class(es) short)")
  # Rank of each example within its class, in file order, without a loop
  # over examples: a stable sort groups each class, keeping file order.
  order = np.argsort(split.labels, kind="stable")
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size) - starts[split.labels[order]]
  return take(split, np.flatnonzero(rank < per_class))
