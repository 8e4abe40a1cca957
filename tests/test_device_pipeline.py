"""The device pipeline (fkjax.data.device_pipeline) makes the host's batches."""
import jax
import numpy as np
import pytest

from fkjax.data import augmentation
from fkjax.data import device_pipeline
from fkjax.data import train_batches
from fkjax.data.types import Split

PAD = augmentation.PAD


def _split(n=40, seed=0):
  rng = np.random.default_rng(seed)
  # no zero pixel in the images: a zero in a crop is padding
  return Split(rng.integers(1, 256, (n, 32, 32, 3), dtype=np.uint8),
               rng.integers(0, 10, n).astype(np.int32))


@pytest.fixture(scope="module")
def split():
  return _split()


@pytest.fixture(scope="module")
def on_device(split):
  return device_pipeline.put_split(split, jax.devices()[0])


def test_a_fixed_crop_and_flip_equal_slicing_the_padded_image_by_hand(split):
  images = split.images[:3]
  padded = np.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
  offsets = np.array([[0, 8], [3, 5], [8, 0]], np.int32)
  flips = np.array([False, True, False])
  out = np.asarray(device_pipeline.crop_and_flip(images, offsets, flips))
  np.testing.assert_array_equal(out[0], padded[0, 0:32, 8:40])
  np.testing.assert_array_equal(out[1], padded[1, 3:35, 5:37][:, ::-1])
  np.testing.assert_array_equal(out[2], padded[2, 8:40, 0:32])
  # the padding is zeros: the corner (0, 8) crop's first 4 rows and last 4
  # columns, and only they
  assert np.all(out[0, :PAD] == 0) and np.all(out[0, :, -PAD:] == 0)
  assert np.all(out[0, PAD:, :-PAD] > 0)


def test_crop_and_flip_equal_the_host_augmentation(split):
  params = augmentation.draw_params(np.random.default_rng(5), 40)
  host = augmentation.apply_params(split.images, params)
  device = device_pipeline.crop_and_flip(
      split.images, params.offsets.astype(np.int32), params.flips)
  np.testing.assert_array_equal(np.asarray(device), host)


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_image_appears_once_an_epoch(drop_last):
  plans = list(device_pipeline.step_plans(40, 16, seed=3, epoch=1,
                                          drop_last=drop_last))
  sizes = [len(p["index"]) for p in plans]
  index = np.concatenate([p["index"] for p in plans])
  assert sizes == ([16, 16] if drop_last else [16, 16, 8])
  assert len(set(index.tolist())) == len(index)   # no image twice
  if not drop_last:
    np.testing.assert_array_equal(np.sort(index), np.arange(40))
  other = np.concatenate([p["index"] for p in device_pipeline.step_plans(
      40, 16, seed=3, epoch=2, drop_last=drop_last)])
  assert not np.array_equal(index, other)   # each epoch its own order


def test_plans_draw_uniform_crops_and_fair_flips():
  n = 81 * 500
  plan = next(device_pipeline.step_plans(n, n, seed=0, epoch=0))
  offsets, flips = plan["offset"], plan["flip"]
  assert offsets.min() == 0 and offsets.max() == 2 * PAD
  counts = np.bincount(offsets[:, 0] * (2 * PAD + 1) + offsets[:, 1],
                       minlength=81)
  assert counts.shape == (81,)
  # 500 expected per crop, standard deviation ~22: within 5 of them
  assert np.all(np.abs(counts - 500) < 112), counts
  assert abs(flips.mean() - 0.5) < 0.01


@pytest.mark.parametrize("augment", [True, False])
def test_device_batches_equal_the_host_batches_bit_for_bit(split, on_device,
                                                           augment):
  make = jax.jit(lambda s, p: device_pipeline.make_batch(s, p,
                                                         augment=augment))
  host = train_batches(split, 16, seed=7, epoch=2, augment=augment,
                       drop_last=False)
  plans = device_pipeline.step_plans(40, 16, seed=7, epoch=2,
                                     drop_last=False)
  pairs = list(zip(host, plans, strict=True))
  assert len(pairs) == 3
  for expected, plan in pairs:
    got = jax.device_get(make(on_device, plan))
    assert got["image"].dtype == np.float32
    np.testing.assert_array_equal(got["image"], expected["image"])
    np.testing.assert_array_equal(got["label"], expected["label"])
