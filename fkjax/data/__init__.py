"""CIFAR-10/100 input pipeline on the host, in NumPy.

Sources (chosen by `load_dataset(source=...)`):
  * "cifar_binary": reader of the official binary release, from the folder or
    straight from the `.tar.gz` archive; no pickle. A missing archive is
    downloaded (md5-checked) into the data directory: `fetch`, or
    `python -m fkjax.data.download cifar10`.
  * "tfds": tensorflow-datasets, read without TensorFlow where TFDS allows.
  * "synthetic": deterministic generated images, flagged `is_synthetic`.

Pipeline: seeded 45K/5K train/val split, balanced subsets, crop+flip
augmentation, shuffled training batches (last partial batch dropped) and
padded, masked evaluation batches, each process taking its slice of every
global batch. Yields host arrays; placing them on devices is up to the caller.

This package imports nothing else from fkjax.
"""
from fkjax.data.augmentation import augment
from fkjax.data.batching import eval_batches
from fkjax.data.batching import num_eval_batches
from fkjax.data.batching import steps_per_epoch
from fkjax.data.batching import to_float
from fkjax.data.batching import train_batches
from fkjax.data.cifar_binary import read_cifar_binary
from fkjax.data.cifar_binary import record_size
from fkjax.data.fetch import DATA_DIR_ENV
from fkjax.data.fetch import default_data_dir
from fkjax.data.fetch import download_cifar
from fkjax.data.fetch import ensure_cifar
from fkjax.data.fetch import resolve_data_dir
from fkjax.data.loader import load_dataset
from fkjax.data.sources import SOURCES
from fkjax.data.splits import limit
from fkjax.data.splits import subset_per_class
from fkjax.data.splits import train_val_split
from fkjax.data.synthetic import synthetic_splits
from fkjax.data.tfds_source import read_tfds
from fkjax.data.types import DataError
from fkjax.data.types import Dataset
from fkjax.data.types import OfficialSplits
from fkjax.data.types import Split

__all__ = [
    "DATA_DIR_ENV",
    "SOURCES",
    "DataError",
    "Dataset",
    "OfficialSplits",
    "Split",
    "augment",
    "default_data_dir",
    "download_cifar",
    "ensure_cifar",
    "eval_batches",
    "load_dataset",
    "num_eval_batches",
    "read_cifar_binary",
    "read_tfds",
    "record_size",
    "resolve_data_dir",
    "steps_per_epoch",
    "limit",
    "subset_per_class",
    "synthetic_splits",
    "to_float",
    "train_batches",
    "train_val_split",
]
