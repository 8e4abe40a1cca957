"""CIFAR-10/100 through tensorflow-datasets, read without TensorFlow.

TFDS is imported lazily, so the rest of fkjax never needs it. What works
without TensorFlow (measured with tensorflow-datasets 4.9.10):

* reading a data_dir that TFDS already prepared in the `array_record` file
  format, through `tfds.data_source` (images decoded by Pillow);
* `tfds.testing.mock_data`.

Preparing the data (the download, or the official archive in `manual_dir`)
runs TFDS's CIFAR builder, which reads the archive with `tf.io.gfile` and
encodes PNGs with `tf.image`: that path needs TensorFlow installed. A data_dir
prepared in the default `tfrecord` format also needs TensorFlow to read; the
binary source (`source="cifar_binary"`) reads the same archive without it.
"""
from __future__ import annotations

import os

import numpy as np

from fkjax.data.types import DataError
from fkjax.data.types import OfficialSplits
from fkjax.data.types import Split

_LABEL_KEYS = {"fine": "label", "coarse": "coarse_label"}


def read_tfds(
    name: str = "cifar10",
    *,
    label: str = "fine",
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    manual_dir: str | os.PathLike[str] | None = None,
) -> OfficialSplits:
  """Loads the official train and test sets through `tfds.data_source`.

  Args:
    name: "cifar10" or "cifar100" (TFDS names).
    label: "fine" or, for cifar100, "coarse".
    data_dir: TFDS data_dir; None means TFDS's default (~/tensorflow_datasets
      or $TFDS_DATA_DIR).
    download: let TFDS download and prepare missing data (needs TensorFlow
      and, without manual_dir, internet).
    manual_dir: folder holding the official archive; TFDS prepares from it
      instead of downloading (needs TensorFlow).

  Returns:
    Train and test splits in the original CIFAR order (TFDS shuffles records
    when preparing; the "id" feature, e.g. "train_00042", restores it).

  Raises:
    DataError: when TFDS cannot provide the data; the message says why.
  """
  if name not in ("cifar10", "cifar100"):
    raise ValueError(f"unknown CIFAR dataset {name!r}")
  if label not in _LABEL_KEYS or (name == "cifar10" and label != "fine"):
    raise ValueError(f"label={label!r} is not available for {name}")
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataError("source='tfds' needs the tensorflow-datasets package, "
                    f"which cannot be imported ({e})") from e
  prepare_kwargs = None
  if manual_dir is not None:
    prepare_kwargs = {"download_config": tfds.download.DownloadConfig(
        manual_dir=os.fspath(manual_dir))}
  where = f"tfds {name} (data_dir={data_dir or 'TFDS default'})"
  try:
    train_src, test_src = tfds.data_source(
        name,
        split=["train", "test"],
        data_dir=data_dir,
        download=download,
        # data_source reads array_record only; ask for it if TFDS prepares.
        builder_kwargs={"file_format": "array_record"},
        download_and_prepare_kwargs=prepare_kwargs,
    )
  except Exception as e:  # TFDS raises many unrelated types; name them all.
    raise DataError(
        f"{where}: TFDS could not provide the data ({type(e).__name__}: {e}). "
        "Reading a data_dir already prepared as array_record works without "
        "TensorFlow; downloading or preparing from manual_dir needs "
        "TensorFlow installed. source='cifar_binary' reads the official "
        "archive without either.") from e
  key = _LABEL_KEYS[label]
  train = _to_split(train_src, key, f"{where} train")
  test = _to_split(test_src, key, f"{where} test")
  names = tuple(train_src.dataset_info.features[key].names)
  return OfficialSplits(train, test, names, where)


def _to_split(source, label_key: str, where: str) -> Split:
  n = len(source)
  if n == 0:
    raise DataError(f"{where}: expected examples, found an empty split")
  # Per index rather than __getitems__: the batched call is broken under
  # tfds.testing.mock_data in 4.9.10, and per-record cost is dominated by PNG
  # decoding anyway.
  examples = [source[i] for i in range(n)]
  ids = [ex["id"].decode() if isinstance(ex["id"], bytes) else str(ex["id"])
         for ex in examples]
  # Ids are zero-padded ("train_00042"), so string order is the file order.
  order = sorted(range(n), key=ids.__getitem__)
  try:
    images = np.stack([np.asarray(examples[i]["image"]) for i in order])
    labels = np.array([int(examples[i][label_key]) for i in order], np.int32)
  except (KeyError, ValueError) as e:
    raise DataError(f"{where}: unexpected example structure "
                    f"({type(e).__name__}: {e}); expected 'id', 'image' and "
                    f"'{label_key}' features") from e
  return Split(images, labels)
