"""Training augmentation: random 32x32 crop of the zero-padded image + flip.

Vectorised NumPy on the host: the random offsets become index arrays and a
single fancy-indexing gather builds the whole batch.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

PAD = 4


class AugmentParams(NamedTuple):
  """Per-image random choices; drawn apart from the pixels so that a batch
  can be split across processes after the draw (see `train_batches`)."""
  offsets: np.ndarray  # int (N, 2): crop corner (row, col) in the padded image
  flips: np.ndarray  # bool (N,): mirror left-right


def draw_params(rng: np.random.Generator, n: int) -> AugmentParams:
  """Draws crop offsets in [0, 2*PAD] and fair coin flips for n images."""
  offsets = rng.integers(0, 2 * PAD + 1, size=(n, 2))
  flips = rng.random(n) < 0.5
  return AugmentParams(offsets, flips)


def apply_params(images: np.ndarray, params: AugmentParams) -> np.ndarray:
  """Crops (with zero padding) and flips `images` as `params` say.

  Args:
    images: uint8 (N, H, W, C).
    params: AugmentParams for N images.

  Returns:
    uint8 (N, H, W, C), a new array.
  """
  n, h, w, _ = images.shape
  padded = np.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
  rows = params.offsets[:, :1] + np.arange(h)  # (N, H)
  cols = params.offsets[:, 1:] + np.arange(w)  # (N, W)
  # Flipping the crop equals reading its columns backwards.
  cols = np.where(params.flips[:, None], cols[:, ::-1], cols)
  return padded[np.arange(n)[:, None, None], rows[:, :, None],
                cols[:, None, :]]


def augment(images_uint8: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Random crop 32 with 4-pixel zero padding, then random horizontal flip.

  Args:
    images_uint8: uint8 images (N, 32, 32, 3).
    rng: the generator to draw from; same state, same output.

  Returns:
    Augmented uint8 images of the same shape.
  """
  return apply_params(images_uint8, draw_params(rng, images_uint8.shape[0]))
