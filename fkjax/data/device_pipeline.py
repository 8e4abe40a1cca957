"""Training batches made on the device from a split kept there.

The host pipeline (:func:`fkjax.data.train_batches`) gathers, crops, flips
and scales every batch in NumPy and copies it to the device. Here the split
is copied to the device once, as uint8; for each step the host sends only
the batch's plan (the image indices and each image's crop corner and flip,
a few kilobytes), and the device builds the batch from it.

The plan is :func:`fkjax.data.batching.epoch_plan`, the host pipeline's own
draw (about a millisecond for 45,000 images), so both pipelines feed a run
the same batches bit for bit and the choice between them changes only its
speed.

Unlike the rest of :mod:`fkjax.data`, this module uses JAX; it still imports
nothing else from fkjax.
"""
from __future__ import annotations

from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fkjax.data import augmentation
from fkjax.data import batching
from fkjax.data.types import Split

PAD = augmentation.PAD


def put_split(split: Split, sharding: jax.sharding.Sharding
              ) -> dict[str, jax.Array]:
  """The split on the device(s) of ``sharding`` (normally replicated):
  ``{"images": uint8 [N, H, W, C], "labels": int32 [N]}``."""
  return jax.device_put({"images": np.asarray(split.images, np.uint8),
                         "labels": np.asarray(split.labels, np.int32)},
                        sharding)


def step_plans(num_examples: int, batch_size: int, *, seed: int, epoch: int,
               drop_last: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """Yields one epoch's plan, one step at a time: the global batch's
  ``{"index": int32 [b], "offset": int32 [b, 2], "flip": bool [b]}``.

  The batches of ``train_batches(split, batch_size, seed=seed, epoch=epoch,
  drop_last=drop_last)`` (one process), the last one smaller unless
  ``drop_last``.
  """
  steps = batching.steps_per_epoch(num_examples, batch_size, drop_last)
  order, params = batching.epoch_plan(num_examples, batch_size, steps,
                                      seed=seed, epoch=epoch)
  order = order.astype(np.int32)
  offsets = params.offsets.astype(np.int32)
  for step in range(steps):
    mine = slice(step * batch_size, (step + 1) * batch_size)
    yield {"index": order[mine], "offset": offsets[mine],
           "flip": params.flips[mine]}


def crop_and_flip(images: jax.Array, offsets: jax.Array, flips: jax.Array
                  ) -> jax.Array:
  """:func:`fkjax.data.augmentation.apply_params` on the device.

  Args:
    images: ``[B, H, W, C]``, any dtype.
    offsets: int ``[B, 2]``: each crop's corner (row, column) in the image
      zero-padded by ``PAD`` pixels on every side, in ``[0, 2 * PAD]``.
    flips: bool ``[B]``: mirror the crop left-right.
  """
  _, h, w, c = images.shape
  padded = jnp.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
  crop = jax.vmap(lambda image, corner: jax.lax.dynamic_slice(
      image, (corner[0], corner[1], 0), (h, w, c)))(padded, offsets)
  return jnp.where(flips[:, None, None, None], crop[:, :, ::-1], crop)


def make_batch(split: dict[str, jax.Array], plan: dict[str, jax.Array], *,
               augment: bool) -> dict[str, jax.Array]:
  """The training batch of ``plan`` (one of :func:`step_plans`), as
  ``train_batches`` yields it: ``{"image": float32 in [0, 1], "label":
  int32}``."""
  images = jnp.take(split["images"], plan["index"], axis=0)
  if augment:
    images = crop_and_flip(images, plan["offset"], plan["flip"])
  # As batching.to_float: one rounding of (float(u8) * float32(1/255)).
  scale = np.float32(1.0 / 255.0)
  return {"image": images.astype(jnp.float32) * scale,
          "label": jnp.take(split["labels"], plan["index"], axis=0)}
