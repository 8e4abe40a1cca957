"""`load_dataset`: one entry point that picks the source named by the config
and applies the validation split and the CPU-scale subsets."""
from __future__ import annotations

import os
from typing import Sequence

from fkjax.data import cifar_binary
from fkjax.data import fetch
from fkjax.data import splits
from fkjax.data import synthetic
from fkjax.data import tfds_source
from fkjax.data.types import DISPLAY_NAMES
from fkjax.data.types import NUM_CLASSES
from fkjax.data.types import OFFICIAL_TEST_SIZE
from fkjax.data.types import OFFICIAL_TRAIN_SIZE
from fkjax.data.types import Dataset
from fkjax.data.types import OfficialSplits
from fkjax.data.types import check_split

DATA_DIR_ENV = fetch.DATA_DIR_ENV
SOURCES = ("cifar_binary", "tfds", "synthetic")
resolve_data_dir = fetch.resolve_data_dir


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
    data_dir: for cifar_binary: the folder holding `cifar-10-batches-bin/`
      or `cifar-10-binary.tar.gz` (CIFAR-100: `cifar-100-binary/` or
      `cifar-100-binary.tar.gz`), or that extracted folder itself. None means
      $FKJAX_DATA_DIR, else `~/.cache/fkjax/data` ($XDG_CACHE_HOME/fkjax/data
      when set). Unused by the other sources.
    val_size: validation examples taken out of the official train set.
    split_seed: seed of the train / val permutation.
    subset_per_class: keep only the first N training examples of each class
      (after the validation split), for CPU-scale runs.
    test_subset_per_class: same for the test split.
    synthetic_sizes: (train_pool, test) sizes for source="synthetic";
      default the official (50000, 10000).
    tfds_data_dir: TFDS data_dir for source="tfds" (None: TFDS default).
    label: "fine" or, for CIFAR-100, "coarse" (20 superclasses).
    strict_sizes: cifar_binary only: require the official record counts.
    tfds_download: let TFDS download / prepare missing data.
    tfds_manual_dir: folder holding the official archive for TFDS.
    synthetic_seed: seed of the synthetic images.
    download: cifar_binary only: when the release is missing at the data
      directory, download the official archive there (md5-checked, with a
      one-line message and a progress bar on stderr). When False, a missing
      release is a DataError naming the download command.

  Returns:
    A Dataset; `description` names the source and sizes for logs.

  Raises:
    DataError: for missing, truncated or malformed data (message names the
      file, what was expected and what was found), or a failed download.
    ValueError: for invalid arguments.
  """
  if (name, label) not in NUM_CLASSES:
    raise ValueError(f"unknown dataset/label {name!r}/{label!r}; expected "
                     f"one of {sorted(NUM_CLASSES)}")
  num_classes = NUM_CLASSES[(name, label)]
  display = DISPLAY_NAMES[name]
  if source == "cifar_binary":
    root = resolve_data_dir(data_dir)
    fetch.ensure_cifar(name, root, download=download)
    official = cifar_binary.read_cifar_binary(
        root, name, label=label, strict_sizes=strict_sizes)
    origin = f"{display} from {official.location} (cifar_binary)"
  elif source == "tfds":
    official = tfds_source.read_tfds(
        name, label=label, data_dir=tfds_data_dir, download=tfds_download,
        manual_dir=tfds_manual_dir)
    origin = f"{display} from {official.location}"
  elif source == "synthetic":
    train_size, test_size = (synthetic_sizes or
                             (OFFICIAL_TRAIN_SIZE, OFFICIAL_TEST_SIZE))
    train, test = synthetic.synthetic_splits(num_classes, train_size,
                                             test_size, seed=synthetic_seed)
    official = OfficialSplits(train, test, (), "synthetic")
    origin = (f"SYNTHETIC random images shaped like {display}, NOT real data "
              f"(seed={synthetic_seed})")
  else:
    raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")

  check_split(official.train, num_classes, f"{origin} train")
  check_split(official.test, num_classes, f"{origin} test")
  train, val = splits.train_val_split(official.train, val_size, split_seed)
  test = official.test
  notes = []
  if subset_per_class is not None:
    train = splits.subset_per_class(train, subset_per_class, num_classes,
                                    f"{origin} train")
    notes.append(f"train subset {subset_per_class}/class")
  if test_subset_per_class is not None:
    test = splits.subset_per_class(test, test_subset_per_class, num_classes,
                                   f"{origin} test")
    notes.append(f"test subset {test_subset_per_class}/class")
  label_note = f", {label} labels" if name == "cifar100" else ""
  description = (
      f"{origin}{label_note}: train {train.num_examples} / val "
      f"{val.num_examples} (split_seed={split_seed}) / test "
      f"{test.num_examples}" + (f" [{', '.join(notes)}]" if notes else ""))
  return Dataset(
      train=train, val=val, test=test, num_classes=num_classes, name=name,
      source=source, is_synthetic=source == "synthetic",
      description=description, class_names=official.class_names)
