"""Tests of the TFDS source, offline and without TensorFlow."""
import importlib.util
import io
import sys

import numpy as np
import pytest

from fkjax import data

tfds = pytest.importorskip("tensorflow_datasets")

_TF_INSTALLED = importlib.util.find_spec("tensorflow") is not None


@pytest.mark.parametrize("name, label, num_classes", [
    ("cifar10", "fine", 10),
    ("cifar100", "fine", 100),
    ("cifar100", "coarse", 20),
])
def test_tfds_source_under_mock_data(name, label, num_classes):
  with tfds.testing.mock_data(num_examples=24):
    ds = data.load_dataset(name, source="tfds", val_size=4, label=label)
  assert ds.source == "tfds" and not ds.is_synthetic
  assert ds.num_classes == num_classes
  assert "tfds" in ds.description
  # mock_data serves the same 24 examples for every split.
  assert (ds.train.num_examples, ds.val.num_examples,
          ds.test.num_examples) == (20, 4, 24)
  for split in (ds.train, ds.val, ds.test):
    assert split.images.shape[1:] == (32, 32, 3)
    assert split.images.dtype == np.uint8 and split.labels.dtype == np.int32
    assert 0 <= split.labels.min() and split.labels.max() < num_classes
  assert len(ds.class_names) == num_classes
  batch = next(data.train_batches(ds.train, 8, seed=0, epoch=0))
  assert batch["image"].shape == (8, 32, 32, 3)


@pytest.fixture
def prepared_cifar10(tmp_path, monkeypatch):
  """A tiny cifar10 that TFDS itself wrote as array_record into tmp_path.

  Preparing needs TensorFlow only to PNG-encode images; this fixture swaps in
  Pillow for that single step so the READ path can be tested without TF.
  """
  # pylint: disable=g-import-not-at-top
  from PIL import Image
  from tensorflow_datasets.core.features import image_feature
  from tensorflow_datasets.image_classification import cifar
  # pylint: enable=g-import-not-at-top

  def encode_png(self, np_image):
    del self
    buf = io.BytesIO()
    Image.fromarray(np_image).save(buf, format="PNG")
    return buf.getvalue()

  monkeypatch.setattr(image_feature._ImageEncoder,  # pylint: disable=protected-access
                      "_encode_image", encode_png)
  rng = np.random.default_rng(0)
  splits = {
      "train": (rng.integers(0, 256, (30, 32, 32, 3), np.uint8),
                rng.integers(0, 10, 30)),
      "test": (rng.integers(0, 256, (12, 32, 32, 3), np.uint8),
               rng.integers(0, 10, 12)),
  }

  class Cifar10FromArrays(cifar.Cifar10, skip_registration=True):
    name = "cifar10"
    # tfds 4.9.10 resolves a builder's code path through importlib_resources,
    # which it only declares for Python < 3.9; a test builder needs no path.
    code_path = None

    def _split_generators(self, dl_manager):
      del dl_manager
      return {s: self._examples(s) for s in splits}

    def _examples(self, split):
      images, labels = splits[split]
      for i in range(len(labels)):
        yield i, {"id": f"{split}_{i:05d}", "image": images[i],
                  "label": int(labels[i])}

  Cifar10FromArrays(data_dir=str(tmp_path),
                    file_format="array_record").download_and_prepare()
  return tmp_path, splits


def test_tfds_reads_prepared_array_record_in_original_order(prepared_cifar10):
  data_dir, splits = prepared_cifar10
  official = data.read_tfds("cifar10", data_dir=data_dir, download=False)
  # TFDS shuffles records when it writes them; the reader restores the order.
  for split, (images, labels) in ((official.train, splits["train"]),
                                  (official.test, splits["test"])):
    np.testing.assert_array_equal(split.images, images)
    np.testing.assert_array_equal(split.labels, labels)
  ds = data.load_dataset("cifar10", source="tfds", tfds_data_dir=data_dir,
                         tfds_download=False, val_size=5)
  assert (ds.train.num_examples, ds.val.num_examples) == (25, 5)
  assert str(data_dir) in ds.description
  if not _TF_INSTALLED:
    assert "tensorflow" not in sys.modules


def test_tfds_without_prepared_data_is_a_data_error(tmp_path):
  with pytest.raises(data.DataError, match=r"tfds cifar10 .*could not provide "
                     r"the data.*needs TensorFlow"):
    data.read_tfds("cifar10", data_dir=tmp_path, download=False)
