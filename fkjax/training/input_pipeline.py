"""The training data as a run's steps take it
(``config.training.data_pipeline``; ``docs/performance.md``).

``"host"`` makes each batch in NumPy and copies it to the devices;
``"device"`` keeps the split on the devices and sends each step its plan
(image indices, crops, flips), from which the step builds the batch. Both
give a run the same batches, so the pipeline is an environment key: a run
may be resumed with the other one.

Every step is its own dispatch: ``config.training.steps_per_dispatch`` is
still accepted, so that older configs load, and changes nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding

from fkjax.config import record as run_config
from fkjax.data import batching
from fkjax.data import device_pipeline
from fkjax.data.types import Split
from fkjax.training import precision

PyTree = Any

PIPELINES = ("auto", "host", "device")


def resolve_pipeline(config: ml_collections.ConfigDict,
                     platform: str | None = None,
                     process_count: int | None = None) -> str:
  """``config.training.data_pipeline`` with ``"auto"`` resolved: ``"device"``
  on GPUs and TPUs, ``"host"`` on CPUs and for multi-process runs.

  Raises:
    ConfigError: ``"device"`` in a multi-process run.
  """
  platform = platform or jax.devices()[0].platform
  process_count = (jax.process_count() if process_count is None
                   else process_count)
  chosen = config.training.get("data_pipeline", "auto")
  if chosen == "auto":
    return "device" if platform != "cpu" and process_count == 1 else "host"
  if chosen == "device" and process_count > 1:
    raise run_config.ConfigError(
        "config.training.data_pipeline='device' keeps the whole split on "
        "one process's devices: use 'host' (or 'auto') for multi-process "
        "runs")
  return chosen


def put(tree: PyTree, sharding: NamedSharding) -> PyTree:
  """This process's part of every leaf, placed as ``sharding`` says."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      sharding, np.asarray(x)), tree)


def stack(feeds: Sequence[PyTree]) -> PyTree:
  """Host pytrees -> one with a leading axis."""
  return jax.tree.map(lambda *xs: np.stack(xs), *feeds)


@dataclasses.dataclass(frozen=True)
class TrainInput:
  """One run's training data as its steps take it.

  Attributes:
    pipeline: ``"host"`` (each batch made in NumPy and copied) or
      ``"device"`` (the split kept on the device; each step gets its plan).
    split: the training split.
    batch_size: the global batch size.
    augment: whether batches are cropped and flipped.
    drop_last: whether an epoch's last, smaller batch is dropped.
  """
  pipeline: str
  split: Split
  batch_size: int
  augment: bool
  drop_last: bool

  @classmethod
  def build(cls, config: ml_collections.ConfigDict, split: Split
            ) -> "TrainInput":
    t = config.training
    return cls(resolve_pipeline(config), split, t.batch_size, t.augment,
               t.drop_last)

  def feeds(self, seed: int, epoch: int) -> Iterator[dict[str, np.ndarray]]:
    """The epoch's feeds, one a step: this process's batch (host), or the
    global batch's plan (device)."""
    if self.pipeline == "device":
      return device_pipeline.step_plans(
          self.split.num_examples, self.batch_size, seed=seed, epoch=epoch,
          drop_last=self.drop_last)
    return batching.train_batches(
        self.split, self.batch_size, seed=seed, epoch=epoch,
        augment=self.augment, process_index=jax.process_index(),
        process_count=jax.process_count(), drop_last=self.drop_last)

  def data(self, sharding: NamedSharding) -> PyTree:
    """What the step programs take as ``data``: the split placed on the
    device (device pipeline), or None."""
    if self.pipeline != "device":
      return None
    return device_pipeline.put_split(self.split, sharding)

  def batch(self, data: PyTree, feed: PyTree) -> dict[str, jax.Array]:
    """A feed -> its batch, inside the step program."""
    if self.pipeline != "device":
      return feed
    return device_pipeline.make_batch(data, feed, augment=self.augment)


def describe(pipeline: str, config: ml_collections.ConfigDict) -> str:
  """E.g. ``data pipeline device, precision float32 (matmuls and
  convolutions at HIGHEST)``: the run's speed settings, for its log."""
  return f"data pipeline {pipeline}, precision {precision.describe(config)}"
