"""Containers, constants and the error type shared by the data modules."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

IMAGE_SIZE = 32
IMAGE_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 3)
# Size of the official CIFAR train / test sets (both CIFAR-10 and CIFAR-100).
OFFICIAL_TRAIN_SIZE = 50_000
OFFICIAL_TEST_SIZE = 10_000

NUM_CLASSES = {
    ("cifar10", "fine"): 10,
    ("cifar100", "fine"): 100,
    ("cifar100", "coarse"): 20,
}
DISPLAY_NAMES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


class DataError(ValueError):
  """A data source is missing, truncated, malformed or holds invalid labels.

  The message names the file, what was expected and what was found, so that a
  broken download never turns into a silently smaller dataset.
  """


class Split(NamedTuple):
  """One split of an image-classification dataset, kept as host uint8 arrays.

  Attributes:
    images: uint8 array of shape (N, 32, 32, 3), NHWC, values 0..255.
    labels: int32 array of shape (N,).
  """
  images: np.ndarray
  labels: np.ndarray

  @property
  def num_examples(self) -> int:
    """Number of examples N (len() of a NamedTuple is its field count)."""
    return int(self.labels.shape[0])


class Dataset(NamedTuple):
  """Train / validation / test splits plus enough metadata to label results.

  Attributes:
    train: training split (official train set minus the validation part).
    val: validation split, a fixed seeded subset of the official train set.
    test: the official test set (or a balanced subset of it).
    num_classes: number of distinct labels.
    name: "cifar10" or "cifar100".
    source: "cifar_binary", "tfds" or "synthetic".
    is_synthetic: True when the images are generated, not real CIFAR.
    description: one line for logs and result files; starts with
      "SYNTHETIC" for generated data.
    class_names: label names when the source provides them, else ().
  """
  train: Split
  val: Split
  test: Split
  num_classes: int
  name: str
  source: str
  is_synthetic: bool
  description: str
  class_names: tuple[str, ...] = ()


class OfficialSplits(NamedTuple):
  """The official train and test sets as a source delivers them.

  Attributes:
    train: the official training set (50,000 images for real CIFAR).
    test: the official test set (10,000 images for real CIFAR).
    class_names: label names, or () when the source has none.
    location: where the data came from, for descriptions and errors.
  """
  train: Split
  test: Split
  class_names: tuple[str, ...]
  location: str


def check_split(split: Split, num_classes: int, where: str) -> None:
  """Raises DataError unless `split` has CIFAR shapes, dtypes and labels."""
  images, labels = split.images, split.labels
  if (images.dtype != np.uint8 or images.ndim != 4 or
      images.shape[1:] != IMAGE_SHAPE):
    raise DataError(
        f"{where}: expected uint8 images of shape (N, 32, 32, 3), found "
        f"{images.dtype} {images.shape}")
  if labels.shape != (images.shape[0],):
    raise DataError(
        f"{where}: expected {images.shape[0]} labels, found shape "
        f"{labels.shape}")
  check_labels(labels, num_classes, where)


def check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
  """Raises DataError naming the first label outside [0, num_classes)."""
  bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
  if bad.size:
    first = int(bad[0])
    raise DataError(
        f"{where}: label out of range: expected 0..{num_classes - 1}, found "
        f"{int(labels[first])} at record {first} ({bad.size} bad record(s) in "
        "all)")
