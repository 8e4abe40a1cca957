"""Host-side batching: shuffled, augmented training batches and padded,
masked evaluation batches, each process getting its slice of a global batch.

The loader knows nothing about devices or meshes; it yields NumPy arrays.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from fkjax.data import augmentation
from fkjax.data import types
from fkjax.data.types import Split

_SCALE = np.float32(1.0 / 255.0)


def steps_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
  """Training batches in an epoch of n examples.

  With ``drop_last`` only full batches count (the rest of the examples is
  dropped); without it the last, smaller batch counts too. A run passes its
  ``config.training.drop_last`` (no default here: the config's is the one).
  Raises ValueError for a batch size below 1, and ``DataError`` (a user's
  mistake, said in one line) when there is no full batch.
  """
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  if n < batch_size:
    raise types.DataError(
        f"config.training.batch_size={batch_size} exceeds the {n} training "
        "examples: the epoch would be empty; choose a batch size of at most "
        f"{n}")
  return n // batch_size if drop_last else -(-n // batch_size)


def num_eval_batches(n: int, batch_size: int) -> int:
  """Evaluation batches needed to see all n examples (the last one padded)."""
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  return -(-n // batch_size)


def to_float(images_uint8: np.ndarray) -> np.ndarray:
  """uint8 [0, 255] -> float32 [0, 1], one pass with no float64 temporary."""
  return np.multiply(images_uint8, _SCALE, dtype=np.float32)


def train_batches(
    split: Split,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    augment: bool = True,
    process_index: int = 0,
    process_count: int = 1,
    drop_last: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
  """Yields one epoch of shuffled (and augmented) training batches.

  The order and the augmentation depend only on (seed, epoch), and are drawn
  for the whole global batch before it is sliced, so the union of what the
  processes see equals what a single process would see.

  Args:
    split: the training split.
    batch_size: the GLOBAL batch size; divisible by process_count.
    seed: base seed of the run.
    epoch: epoch number; each epoch has its own order and augmentation.
    augment: apply random crop + flip.
    process_index: this process's index in [0, process_count).
    process_count: number of processes sharing each global batch.
    drop_last: drop the examples that do not fill a last batch (True), or
      yield them as a last, smaller batch (its size must then also divide
      by process_count).

  Yields:
    {"image": float32 (batch_size // process_count, 32, 32, 3) in [0, 1],
     "label": int32 (batch_size // process_count,)}; steps_per_epoch(N,
    batch_size, drop_last) batches.
  """
  # Checked here, not inside the generator, so that bad arguments fail at
  # the call rather than at the first next().
  local = _local_size(batch_size, process_index, process_count)
  n = split.num_examples
  steps = steps_per_epoch(n, batch_size, drop_last)
  rest = n % batch_size
  if not drop_last and rest % process_count:
    raise ValueError(f"the last batch of {rest} examples does not divide "
                     f"over {process_count} processes: use drop_last")
  return _train_iter(split, batch_size, steps, local, seed, epoch, augment,
                     process_index, process_count)


def epoch_plan(num_examples: int, batch_size: int, steps: int, *, seed: int,
               epoch: int) -> tuple[np.ndarray, augmentation.AugmentParams]:
  """The order and augmentation of one epoch: what ``train_batches`` draws.

  Returns:
    ``(order, params)``: the indices of the examples the epoch's ``steps``
    batches take, in order (``min(num_examples, steps * batch_size)`` of
    them), and each one's crop and flip. A function of ``(seed, epoch)``
    only, so that the device pipeline (:mod:`fkjax.data.device_pipeline`)
    feeds the same batches as the host one.
  """
  rng = np.random.default_rng([seed, epoch])
  order_rng, augment_rng = rng.spawn(2)
  n = min(num_examples, steps * batch_size)
  order = order_rng.permutation(num_examples)[:n]
  return order, augmentation.draw_params(augment_rng, n)


def _train_iter(split: Split, batch_size: int, steps: int, local: int,
                seed: int, epoch: int, augment: bool, process_index: int,
                process_count: int) -> Iterator[dict[str, np.ndarray]]:
  order, params = epoch_plan(split.num_examples, batch_size, steps,
                             seed=seed, epoch=epoch)
  n = len(order)
  for step in range(steps):
    size = min(batch_size, n - step * batch_size)
    local = size // process_count
    lo = process_index * local
    mine = slice(step * batch_size + lo, step * batch_size + lo + local)
    idx = order[mine]
    images = split.images[idx]
    if augment:
      images = augmentation.apply_params(
          images, augmentation.AugmentParams(params.offsets[mine],
                                             params.flips[mine]))
    yield {"image": to_float(images),
           "label": split.labels[idx].astype(np.int32, copy=False)}


def eval_batches(
    split: Split,
    batch_size: int,
    *,
    rows: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
  """Yields every example exactly once, in order, in fixed-size batches.

  The last global batch is padded with zero images (label 0) whose mask is
  False, so every process yields the same number of equally shaped batches
  and accuracy is sum(correct * mask) / sum(mask).

  Args:
    split: the split to evaluate.
    batch_size: the examples of a GLOBAL batch.
    rows: the rows of a global batch (default ``batch_size``), a multiple of
      process_count: the rows past ``batch_size`` are padding too, so that
      a batch divides over devices (or processes) however many examples it
      holds; the examples of each batch are the same whatever ``rows``.
    process_index: this process's index in [0, process_count).
    process_count: number of processes sharing each global batch.

  Yields:
    {"image": float32 (local, 32, 32, 3), "label": int32 (local,),
     "mask": bool (local,)} with local = rows // process_count.
  """
  rows = batch_size if rows is None else rows
  if rows < batch_size:
    raise ValueError(f"rows {rows} cannot hold a batch of {batch_size}")
  local = _local_size(rows, process_index, process_count)
  return _eval_iter(split, batch_size, local, process_index)


def _eval_iter(split: Split, batch_size: int, local: int,
               process_index: int) -> Iterator[dict[str, np.ndarray]]:
  n = split.num_examples
  for b in range(num_eval_batches(n, batch_size)):
    offset = process_index * local + np.arange(local)
    idx = b * batch_size + offset
    mask = (idx < n) & (offset < batch_size)
    idx = np.where(mask, idx, 0)
    images = split.images[idx]
    images[~mask] = 0
    labels = np.where(mask, split.labels[idx], 0).astype(np.int32)
    yield {"image": to_float(images), "label": labels, "mask": mask}


def _local_size(batch_size: int, process_index: int, process_count: int) -> int:
  if process_count <= 0 or not 0 <= process_index < process_count:
    raise ValueError(f"need 0 <= process_index < process_count, got "
                     f"process_index={process_index}, "
                     f"process_count={process_count}")
  if batch_size <= 0 or batch_size % process_count:
    raise ValueError(f"batch_size {batch_size} must be a positive multiple "
                     f"of process_count {process_count}")
  return batch_size // process_count
