"""Which test images an attack left correctly classified, as short text.

An evaluation keeps, per attack, one bit per test image (``correct_per_image``:
attack -> ``encode_correct(vector)``), so two nets evaluated on the same
images can be compared image by image (``decode_correct``).
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

# How ``correct_per_image`` vectors are written: one bit per test image, in
# test-set order, packed by ``numpy.packbits`` (first image in the highest
# bit of the first byte), then base64.
CORRECT_ENCODING = "base64 of numpy.packbits (bitorder big), one bit per image"


def encode_correct(correct: Any) -> str:
  """A boolean vector (one entry per test image) as a short ASCII string."""
  bits = np.packbits(np.asarray(correct, dtype=bool).reshape(-1))
  return base64.b64encode(bits.tobytes()).decode("ascii")


def decode_correct(text: str, num_images: int) -> np.ndarray:
  """The boolean vector of :func:`encode_correct` (``num_images`` long)."""
  bits = np.frombuffer(base64.b64decode(text), dtype=np.uint8)
  if bits.size != (num_images + 7) // 8:
    raise ValueError(f"{bits.size} bytes cannot hold {num_images} images")
  return np.unpackbits(bits, count=num_images).astype(bool)
