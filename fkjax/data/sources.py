"""The official train and test sets from the source a config names
("cifar_binary", "tfds" or "synthetic"), with the line that says where they
came from (the head of the dataset's description, and of its errors)."""
from __future__ import annotations

import os
from typing import Sequence

from fkjax.data import cifar_binary
from fkjax.data import fetch
from fkjax.data import synthetic
from fkjax.data import tfds_source
from fkjax.data.types import DISPLAY_NAMES
from fkjax.data.types import OFFICIAL_TEST_SIZE
from fkjax.data.types import OFFICIAL_TRAIN_SIZE
from fkjax.data.types import OfficialSplits

SOURCES = ("cifar_binary", "tfds", "synthetic")


def read_official(
    name: str,
    source: str,
    label: str,
    num_classes: int,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    strict_sizes: bool = True,
    download: bool = True,
    tfds_data_dir: str | os.PathLike[str] | None = None,
    tfds_download: bool = True,
    tfds_manual_dir: str | os.PathLike[str] | None = None,
    synthetic_sizes: Sequence[int] | None = None,
    synthetic_seed: int = 0,
) -> tuple[OfficialSplits, str]:
  """Reads the official train and test sets of `name` from `source`.

  Each source reads only its own keyword arguments.

  Args:
    name: "cifar10" or "cifar100".
    source: one of SOURCES.
    label: "fine" or, for CIFAR-100, "coarse" (20 superclasses).
    num_classes: the number of classes of (name, label).
    data_dir: for cifar_binary: the folder holding `cifar-10-batches-bin/`
      or `cifar-10-binary.tar.gz` (CIFAR-100: `cifar-100-binary/` or
      `cifar-100-binary.tar.gz`), or that extracted folder itself. None means
      $FKJAX_DATA_DIR, else `~/.cache/fkjax/data` ($XDG_CACHE_HOME/fkjax/data
      when set).
    strict_sizes: cifar_binary only: require the official record counts.
    download: cifar_binary only: when the release is missing at the data
      directory, download the official archive there (md5-checked, with a
      one-line message and a progress bar on stderr). When False, a missing
      release is a DataError naming the download command.
    tfds_data_dir: TFDS data_dir for source="tfds" (None: TFDS default).
    tfds_download: let TFDS download / prepare missing data.
    tfds_manual_dir: folder holding the official archive for TFDS.
    synthetic_sizes: (train_pool, test) sizes for source="synthetic";
      default (also when empty) the official (50000, 10000).
    synthetic_seed: seed of the synthetic images.

  Returns:
    (the official splits, unchecked; where they came from, for descriptions
    and errors: "CIFAR-10 from <location> (cifar_binary)", ...).

  Raises:
    ValueError: for an unknown source.
    DataError: from the source, for missing or malformed data.
  """
  if source == "cifar_binary":
    return _from_cifar_binary(name, label, data_dir, strict_sizes, download)
  if source == "tfds":
    return _from_tfds(name, label, tfds_data_dir, tfds_download,
                      tfds_manual_dir)
  if source == "synthetic":
    return _from_synthetic(name, num_classes, synthetic_sizes, synthetic_seed)
  raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")


def _from_cifar_binary(
    name: str, label: str, data_dir: str | os.PathLike[str] | None,
    strict_sizes: bool, download: bool) -> tuple[OfficialSplits, str]:
  """The official binary release, downloaded first when missing."""
  root = fetch.resolve_data_dir(data_dir)
  fetch.ensure_cifar(name, root, download=download)
  official = cifar_binary.read_cifar_binary(
      root, name, label=label, strict_sizes=strict_sizes)
  return official, (f"{DISPLAY_NAMES[name]} from {official.location} "
                    "(cifar_binary)")


def _from_tfds(
    name: str, label: str, data_dir: str | os.PathLike[str] | None,
    download: bool, manual_dir: str | os.PathLike[str] | None
) -> tuple[OfficialSplits, str]:
  """tensorflow-datasets' copy; its location already names TFDS."""
  official = tfds_source.read_tfds(
      name, label=label, data_dir=data_dir, download=download,
      manual_dir=manual_dir)
  return official, f"{DISPLAY_NAMES[name]} from {official.location}"


def _from_synthetic(
    name: str, num_classes: int, sizes: Sequence[int] | None,
    seed: int) -> tuple[OfficialSplits, str]:
  """Generated images; the origin says loudly that they are not CIFAR, since
  it heads every description and result file made from them."""
  train_size, test_size = sizes or (OFFICIAL_TRAIN_SIZE, OFFICIAL_TEST_SIZE)
  train, test = synthetic.synthetic_splits(num_classes, train_size, test_size,
                                           seed=seed)
  official = OfficialSplits(train, test, (), "synthetic")
  return official, (f"SYNTHETIC random images shaped like "
                    f"{DISPLAY_NAMES[name]}, NOT real data (seed={seed})")
