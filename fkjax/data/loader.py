"""`load_dataset`: one entry point that reads the source named by the config
(`fkjax.data.sources`) and applies the validation split and the CPU-scale
subsets."""
from __future__ import annotations

import os
from typing import Sequence

from fkjax.data import sources
from fkjax.data import splits
from fkjax.data.types import NUM_CLASSES
from fkjax.data.types import Dataset
from fkjax.data.types import Split
from fkjax.data.types import check_split


def load_dataset(
    name: str = "cifar10",
    source: str = "cifar_binary",
    data_dir: str | os.PathLike[str] | None = None,
    *,
    val_size: int = 5000,
    split_seed: int = 0,
    subset_per_class: int | None = None,
    test_subset_per_class: int | None = None,
    synthetic_sizes: Sequence[int] | None = None,
    tfds_data_dir: str | os.PathLike[str] | None = None,
    label: str = "fine",
    strict_sizes: bool = True,
    tfds_download: bool = True,
    tfds_manual_dir: str | os.PathLike[str] | None = None,
    synthetic_seed: int = 0,
    download: bool = True,
) -> Dataset:
  """Loads CIFAR-10/100 from the chosen source and splits it.

  The official train set is split into train / val by a fixed permutation
  drawn from `split_seed` (45,000 / 5,000 by default, as in the paper); the
  test split is the official test set.

  Args:
    name: "cifar10" or "cifar100".
    source: "cifar_binary" (NumPy reader of the official binary release),
      "tfds" (tensorflow-datasets) or "synthetic" (generated, NOT CIFAR).
    data_dir, strict_sizes, download: for source="cifar_binary": where the
      release is (None: $FKJAX_DATA_DIR, else `~/.cache/fkjax/data`), whether
      to require the official record counts, and whether to download the
      release when it is missing there (else a DataError naming the command).
    val_size: validation examples taken out of the official train set.
    split_seed: seed of the train / val permutation.
    subset_per_class: keep only the first N training examples of each class
      (after the validation split), for CPU-scale runs.
    test_subset_per_class: same for the test split.
    synthetic_sizes, synthetic_seed: for source="synthetic".
    tfds_data_dir, tfds_download, tfds_manual_dir: for source="tfds".
    label: "fine" or, for CIFAR-100, "coarse" (20 superclasses).
    (The source options in full: `fkjax.data.sources.read_official`.)

  Returns:
    A Dataset; `description` names the source and sizes for logs.

  Raises:
    DataError: for missing, truncated or malformed data (message names the
      file, what was expected and what was found), or a failed download.
    ValueError: for invalid arguments.
  """
  num_classes = _num_classes(name, label)
  official, origin = sources.read_official(
      name, source, label, num_classes, data_dir=data_dir,
      strict_sizes=strict_sizes, download=download,
      tfds_data_dir=tfds_data_dir, tfds_download=tfds_download,
      tfds_manual_dir=tfds_manual_dir, synthetic_sizes=synthetic_sizes,
      synthetic_seed=synthetic_seed)
  check_split(official.train, num_classes, f"{origin} train")
  check_split(official.test, num_classes, f"{origin} test")
  train, val = splits.train_val_split(official.train, val_size, split_seed)
  train, test, notes = _subsets(train, official.test, subset_per_class,
                                test_subset_per_class, num_classes, origin)
  return Dataset(
      train=train, val=val, test=test, num_classes=num_classes, name=name,
      source=source, is_synthetic=source == "synthetic",
      description=_describe(origin, name, label, train, val, test,
                            split_seed, notes),
      class_names=official.class_names)


def _num_classes(name: str, label: str) -> int:
  """The number of classes of (name, label); refuses any other pair before
  any data are read."""
  if (name, label) not in NUM_CLASSES:
    raise ValueError(f"unknown dataset/label {name!r}/{label!r}; expected "
                     f"one of {sorted(NUM_CLASSES)}")
  return NUM_CLASSES[(name, label)]


def _subsets(train: Split, test: Split, per_class: int | None,
             test_per_class: int | None, num_classes: int,
             origin: str) -> tuple[Split, Split, list[str]]:
  """The balanced per-class subsets asked for (None: the whole split), and a
  note for the description on each one taken."""
  notes = []
  if per_class is not None:
    train = splits.subset_per_class(train, per_class, num_classes,
                                    f"{origin} train")
    notes.append(f"train subset {per_class}/class")
  if test_per_class is not None:
    test = splits.subset_per_class(test, test_per_class, num_classes,
                                   f"{origin} test")
    notes.append(f"test subset {test_per_class}/class")
  return train, test, notes


def _describe(origin: str, name: str, label: str, train: Split, val: Split,
              test: Split, split_seed: int, notes: list[str]) -> str:
  """The dataset's one line for logs and result files: where the data came
  from, the label kind (CIFAR-100), the split sizes and any subsets."""
  label_note = f", {label} labels" if name == "cifar100" else ""
  return (
      f"{origin}{label_note}: train {train.num_examples} / val "
      f"{val.num_examples} (split_seed={split_seed}) / test "
      f"{test.num_examples}" + (f" [{', '.join(notes)}]" if notes else ""))
