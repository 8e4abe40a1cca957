"""Deterministic synthetic CIFAR-shaped data for tests and benchmarks.

NOT CIFAR: every image is a per-class base colour plus uniform noise, so a
model can learn something (useful for smoke tests of training) but nothing
measured on it says anything about CIFAR. Datasets built from it carry
`is_synthetic=True` and a description starting with "SYNTHETIC".
"""
from __future__ import annotations

import numpy as np

from fkjax.data.types import IMAGE_SHAPE
from fkjax.data.types import Split

# Noise amplitude: base colours lie in [0, 255 - _NOISE] so uint8 never wraps.
_NOISE = 96


def synthetic_splits(num_classes: int, train_size: int, test_size: int,
                     seed: int = 0) -> tuple[Split, Split]:
  """Generates a train pool and a test set with balanced labels.

  Args:
    num_classes: number of labels.
    train_size: size of the pool that plays the official train set (the
      validation split is later taken from it).
    test_size: size of the test set.
    seed: the same seed always gives the same arrays.

  Returns:
    (train, test) with uint8 (N, 32, 32, 3) images and int32 labels.
  """
  if train_size <= 0 or test_size <= 0:
    raise ValueError(f"synthetic sizes must be positive, got train_size="
                     f"{train_size}, test_size={test_size}")
  rng = np.random.default_rng([seed, num_classes])
  base = rng.integers(0, 256 - _NOISE, size=(num_classes, 1, 1, 3),
                      dtype=np.uint8)
  train_rng, test_rng = rng.spawn(2)
  return (_make(train_rng, base, train_size), _make(test_rng, base, test_size))


def _make(rng: np.random.Generator, base: np.ndarray, n: int) -> Split:
  num_classes = base.shape[0]
  labels = rng.permutation(np.arange(n, dtype=np.int32) % num_classes)
  noise = rng.integers(0, _NOISE, size=(n,) + IMAGE_SHAPE, dtype=np.uint8)
  # In place to avoid a second full-size temporary for 50,000 images.
  noise += base[labels]
  return Split(noise, labels)
