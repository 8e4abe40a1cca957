"""Tests of splits, subsets, augmentation, batching and synthetic data."""
import numpy as np
import pytest

from fkjax import data


def _id_split(n, seed=0):
  """A split whose label is the example's index, so batches can be traced
  back to examples; pixels are >= 1 so zeros can only come from padding."""
  rng = np.random.default_rng(seed)
  images = rng.integers(1, 256, size=(n, 32, 32, 3), dtype=np.uint8)
  return data.Split(images, np.arange(n, dtype=np.int32))


def _class_split(labels, seed=0):
  labels = np.asarray(labels, np.int32)
  rng = np.random.default_rng(seed)
  images = rng.integers(1, 256, size=(len(labels), 32, 32, 3), dtype=np.uint8)
  return data.Split(images, labels)


# --- splits and subsets


def test_train_val_split_is_a_seeded_partition():
  split = _id_split(100)
  train, val = data.train_val_split(split, 10, seed=3)
  assert (train.num_examples, val.num_examples) == (90, 10)
  assert np.intersect1d(train.labels, val.labels).size == 0
  np.testing.assert_array_equal(
      np.sort(np.concatenate([train.labels, val.labels])), np.arange(100))
  # Images travel with their labels, and both parts keep file order.
  np.testing.assert_array_equal(val.images, split.images[val.labels])
  assert np.all(np.diff(train.labels) > 0) and np.all(np.diff(val.labels) > 0)
  again = data.train_val_split(split, 10, seed=3)[1]
  other = data.train_val_split(split, 10, seed=4)[1]
  np.testing.assert_array_equal(again.labels, val.labels)
  assert not np.array_equal(other.labels, val.labels)


def test_train_val_split_rejects_bad_sizes():
  with pytest.raises(ValueError, match="val_size"):
    data.train_val_split(_id_split(10), 10, seed=0)


def test_subset_per_class_takes_the_first_n_of_each_class():
  labels = [2, 0, 1, 0, 2, 2, 1, 0, 1, 2, 0]
  split = _class_split(labels)
  sub = data.subset_per_class(split, 2, 3, "where")
  # First two 0s (idx 1, 3), 1s (2, 6), 2s (0, 4), in file order.
  expected = [0, 1, 2, 3, 4, 6]
  np.testing.assert_array_equal(sub.labels, np.asarray(labels)[expected])
  np.testing.assert_array_equal(sub.images, split.images[expected])


def test_subset_per_class_refuses_to_be_unbalanced():
  split = _class_split([0, 0, 0, 1, 2, 2])
  with pytest.raises(data.DataError, match=r"where: cannot take 2 examples "
                     r"per class; class 1 has only 1"):
    data.subset_per_class(split, 2, 3, "where")


# --- augmentation


def _all_crops(image):
  """Every crop+flip the augmentation may produce, by the definition."""
  padded = np.pad(image, ((4, 4), (4, 4), (0, 0)))
  out = []
  for dy in range(9):
    for dx in range(9):
      crop = padded[dy:dy + 32, dx:dx + 32]
      out += [crop, crop[:, ::-1]]
  return out


def test_augment_outputs_are_valid_crops_and_flips():
  images = _id_split(64).images
  out = data.augment(images, np.random.default_rng(0))
  assert out.shape == images.shape and out.dtype == np.uint8
  for i in range(0, 64, 8):
    assert any(np.array_equal(out[i], c) for c in _all_crops(images[i]))
  # All-zero rows come from the padding: |dy - 4| of them, so over 64 images
  # every vertical shift 0..4 should appear.
  zero_rows = (out == 0).all(axis=(2, 3)).sum(axis=1)
  assert set(zero_rows.tolist()) == {0, 1, 2, 3, 4}


def test_augment_is_deterministic_per_seed_and_random_across_seeds():
  images = _id_split(32).images
  a = data.augment(images, np.random.default_rng(7))
  b = data.augment(images, np.random.default_rng(7))
  c = data.augment(images, np.random.default_rng(8))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  # Input untouched: augmentation returns a new array.
  np.testing.assert_array_equal(images, _id_split(32).images)


def test_augment_flips_about_half():
  # A left-right ramp: after a crop, flipped images decrease left to right.
  ramp = np.broadcast_to(np.arange(10, 42, dtype=np.uint8)[None, :, None],
                         (32, 32, 3))
  images = np.repeat(ramp[None], 400, axis=0)
  out = data.augment(images, np.random.default_rng(1)).astype(int)
  flipped = out[:, 16, 12, 0] > out[:, 16, 20, 0]
  assert 150 < flipped.sum() < 250


# --- training batches


def test_steps_per_epoch_refuses_an_empty_epoch():
  assert data.steps_per_epoch(16, 16, drop_last=True) == 1
  with pytest.raises(ValueError, match="exceeds the 15 training examples"):
    data.steps_per_epoch(15, 16, drop_last=True)


def test_steps_per_epoch_takes_drop_last_from_its_caller():
  # No default of its own: config.training.drop_last (False) is the one.
  with pytest.raises(TypeError, match="drop_last"):
    data.steps_per_epoch(70, 16)   # pylint: disable=no-value-for-parameter
  assert data.steps_per_epoch(70, 16, drop_last=False) == 5


def test_train_batches_shapes_and_one_pass_over_the_data():
  split = _id_split(70)
  batches = list(data.train_batches(split, 16, seed=0, epoch=0,
                                    augment=False))
  assert len(batches) == data.steps_per_epoch(70, 16, drop_last=True) == 4
  for b in batches:
    assert b["image"].shape == (16, 32, 32, 3)
    assert b["image"].dtype == np.float32
    assert b["label"].shape == (16,) and b["label"].dtype == np.int32
    # Without augmentation the images are the originals scaled to [0, 1].
    np.testing.assert_allclose(b["image"],
                               split.images[b["label"]] / np.float32(255),
                               rtol=1e-6)
  seen = np.concatenate([b["label"] for b in batches])
  assert len(np.unique(seen)) == 64  # no repeats; the last 6 are dropped
  assert not np.array_equal(seen, np.arange(64))  # shuffled


def test_train_batches_deterministic_per_seed_epoch_and_vary_by_epoch():
  split = _id_split(64)

  def run(seed, epoch):
    return list(data.train_batches(split, 32, seed=seed, epoch=epoch))

  a, b, c = run(0, 0), run(0, 0), run(0, 1)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x["image"], y["image"])
    np.testing.assert_array_equal(x["label"], y["label"])
  assert not np.array_equal(a[0]["label"], c[0]["label"])
  # Same example in two epochs: augmented differently (most of the time).
  first = {int(l): img for b in a for l, img in zip(b["label"], b["image"])}
  second = {int(l): img for b in c for l, img in zip(b["label"], b["image"])}
  differ = sum(not np.array_equal(first[k], second[k]) for k in first)
  assert differ > 48
  assert 0.0 <= min(x["image"].min() for x in a)
  assert max(x["image"].max() for x in a) <= 1.0


def test_train_batches_processes_split_each_global_batch():
  split = _id_split(50)
  whole = list(data.train_batches(split, 12, seed=5, epoch=2))
  parts = [list(data.train_batches(split, 12, seed=5, epoch=2,
                                   process_index=p, process_count=3))
           for p in range(3)]
  assert all(len(p) == len(whole) == 4 for p in parts)
  for step, batch in enumerate(whole):
    for key in ("image", "label"):
      joined = np.concatenate([parts[p][step][key] for p in range(3)])
      np.testing.assert_array_equal(joined, batch[key])


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=10, process_count=3), "multiple of process_count"),
    (dict(batch_size=12, process_index=3, process_count=3), "process_index"),
    (dict(batch_size=64), "exceeds"),
])
def test_train_batches_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    # Raised at the call, before any batch is requested.
    data.train_batches(_id_split(20), seed=0, epoch=0, **kwargs)
  with pytest.raises(ValueError, match="process_count"):
    data.eval_batches(_id_split(20), 12, process_index=0, process_count=5)


# --- evaluation batches


def test_eval_batches_pad_and_mask_so_each_example_counts_once():
  split = _id_split(37)
  batches = list(data.eval_batches(split, 16))
  assert len(batches) == data.num_eval_batches(37, 16) == 3
  for b in batches:
    assert b["image"].shape == (16, 32, 32, 3)
    assert b["image"].dtype == np.float32
    assert b["label"].dtype == np.int32 and b["mask"].dtype == bool
  labels = np.concatenate([b["label"][b["mask"]] for b in batches])
  np.testing.assert_array_equal(labels, np.arange(37))
  last = batches[-1]
  assert last["mask"].sum() == 5
  assert not last["image"][~last["mask"]].any()
  np.testing.assert_allclose(last["image"][last["mask"]],
                             split.images[32:] / np.float32(255), rtol=1e-6)


def test_eval_batches_across_processes_cover_each_example_once():
  split = _id_split(45)
  parts = [list(data.eval_batches(split, 16, process_index=p,
                                  process_count=4)) for p in range(4)]
  assert len({len(p) for p in parts}) == 1  # same number of steps everywhere
  assert all(b["image"].shape[0] == 4 for p in parts for b in p)
  labels = np.concatenate(
      [b["label"][b["mask"]] for p in parts for b in p])
  np.testing.assert_array_equal(np.sort(labels), np.arange(45))


def test_eval_batches_padded_to_more_rows_hold_the_same_examples():
  """Rows past the batch size (a multiple of the devices) are padding: each
  batch keeps its examples, in every process's slice."""
  split = _id_split(37)
  plain = list(data.eval_batches(split, 20))
  for count in (1, 2):
    parts = [list(data.eval_batches(split, 20, rows=24, process_index=p,
                                    process_count=count))
             for p in range(count)]
    joined = [{k: np.concatenate([p[i][k] for p in parts])
               for k in ("label", "mask")} for i in range(len(plain))]
    assert all(len(p) == len(plain) for p in parts)
    for padded, batch in zip(joined, plain):
      assert padded["mask"].shape == (24,) and not padded["mask"][20:].any()
      np.testing.assert_array_equal(padded["label"][padded["mask"]],
                                    batch["label"][batch["mask"]])
  with pytest.raises(ValueError, match="rows"):
    data.eval_batches(split, 20, rows=16)


def test_eval_batches_of_an_empty_split_yield_nothing():
  empty = data.Split(np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int32))
  assert list(data.eval_batches(empty, 8)) == []


# --- synthetic source


def test_synthetic_dataset_is_labelled_deterministic_and_balanced():
  kwargs = dict(source="synthetic", synthetic_sizes=(300, 60), val_size=50)
  ds = data.load_dataset("cifar10", **kwargs)
  again = data.load_dataset("cifar10", **kwargs)
  other = data.load_dataset("cifar10", synthetic_seed=1, **kwargs)
  assert ds.is_synthetic and ds.source == "synthetic"
  assert ds.description.startswith("SYNTHETIC")
  assert "NOT real data" in ds.description
  assert (ds.train.num_examples, ds.val.num_examples,
          ds.test.num_examples) == (250, 50, 60)
  assert ds.train.images.dtype == np.uint8 and ds.train.labels.dtype == np.int32
  np.testing.assert_array_equal(ds.train.images, again.train.images)
  np.testing.assert_array_equal(ds.test.labels, again.test.labels)
  assert not np.array_equal(ds.train.images, other.train.images)
  np.testing.assert_array_equal(np.bincount(ds.test.labels), [6] * 10)
  # Learnable: per-class mean colours differ between classes.
  means = np.stack([ds.test.images[ds.test.labels == c].mean(axis=(0, 1, 2))
                    for c in range(10)])
  assert np.ptp(means, axis=0).max() > 20


def test_load_dataset_subsets_and_cifar100_labels():
  ds = data.load_dataset("cifar100", source="synthetic",
                         synthetic_sizes=(2000, 400), val_size=200,
                         subset_per_class=3, test_subset_per_class=2)
  assert ds.num_classes == 100
  np.testing.assert_array_equal(np.bincount(ds.train.labels), [3] * 100)
  np.testing.assert_array_equal(np.bincount(ds.test.labels), [2] * 100)
  assert ds.val.num_examples == 200
  assert "train subset 3/class" in ds.description
  coarse = data.load_dataset("cifar100", source="synthetic", label="coarse",
                             synthetic_sizes=(200, 40), val_size=20)
  assert coarse.num_classes == 20 and coarse.train.labels.max() < 20


def test_load_dataset_rejects_unknown_names():
  with pytest.raises(ValueError, match="unknown source"):
    data.load_dataset("cifar10", source="imagenet")
  with pytest.raises(ValueError, match="unknown dataset/label"):
    data.load_dataset("cifar10", source="synthetic", label="coarse")
