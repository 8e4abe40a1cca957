"""How training steps reach the device: the data pipeline, and several steps
per jitted call (``config.training.data_pipeline`` and
``config.training.steps_per_dispatch``; ``docs/performance.md``).

Neither changes what a run computes: the device pipeline builds the host
pipeline's batches from the same plan, and ``k`` steps in one ``lax.scan``
give the states of ``k`` calls of one step (bit for bit on one CPU device,
``tests/test_dispatch.py``; on several devices the device pipeline's
states agree to float rounding). So both are environment keys: a run may
be resumed with other values.

A single run (:mod:`fkjax.training.train`) and a sweep (:mod:`fkjax.training.sweep`) build
their step programs here, from their own ``step_fn``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fkjax.config import record as run_config
from fkjax.data import batching
from fkjax.data import device_pipeline
from fkjax.data.types import Split

PyTree = Any

PIPELINES = ("auto", "host", "device")
# steps_per_dispatch=0 (auto): on accelerators, enough steps that the host's
# per-call work hides behind the device's; on CPU the host is the device.
AUTO_STEPS_PER_DISPATCH = 8


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


def resolve_steps_per_dispatch(config: ml_collections.ConfigDict,
                               platform: str | None = None) -> int:
  """``config.training.steps_per_dispatch`` with 0 (auto) resolved: 1 on
  CPUs, :data:`AUTO_STEPS_PER_DISPATCH` elsewhere."""
  k = int(config.training.get("steps_per_dispatch", 0) or 0)
  if k:
    return k
  platform = platform or jax.devices()[0].platform
  return 1 if platform == "cpu" else AUTO_STEPS_PER_DISPATCH


def scan_limit(num_examples: int, batch_size: int, drop_last: bool) -> int:
  """The steps of an epoch whose batches have the full size (only these
  share a dispatch; a last, smaller batch runs alone)."""
  steps = batching.steps_per_epoch(num_examples, batch_size, drop_last)
  return steps - (0 if drop_last or num_examples % batch_size == 0 else 1)


def stacked(sharding: NamedSharding) -> NamedSharding:
  """The sharding of ``k`` arrays of ``sharding`` stacked on a new first
  axis."""
  return NamedSharding(sharding.mesh, P(None, *sharding.spec))


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

  @property
  def scan_limit(self) -> int:
    return scan_limit(self.split.num_examples, self.batch_size,
                      self.drop_last)


@dataclasses.dataclass
class StepProgram:
  """Runs one or several training steps per call: ``(state, feeds, step)
  -> (state, metrics)``, the signature of
  :func:`fkjax.training.epoch_steps.run_epoch_steps`'s ``step_fn``.

  Attributes:
    one: jitted ``(state, data, feed, step, extra) -> (state, metrics)``.
    many: jitted ``(state, data, feeds, steps, extra) -> (state, metrics)``
      over a leading axis of ``feeds``, ``steps`` and ``metrics``.
    data: the resident training data (or None).
    place: ``(feed, is_stacked) -> feed on the devices``.
    extra: the programs' last argument (keys, a sweep's values).
  """
  one: Callable
  many: Callable
  data: PyTree
  place: Callable[[PyTree, bool], PyTree]
  extra: PyTree

  def __call__(self, state: PyTree, feeds: Sequence[PyTree], step: int
               ) -> tuple[PyTree, PyTree]:
    if len(feeds) == 1:
      return self.one(state, self.data, self.place(feeds[0], False), step,
                      self.extra)
    steps = np.arange(step, step + len(feeds), dtype=np.int32)
    return self.many(state, self.data, self.place(stack(feeds), True), steps,
                     self.extra)


def step_program(step_fn: Callable, make_batch: Callable, *, data: PyTree,
                 place: Callable[[PyTree, bool], PyTree], extra: PyTree
                 ) -> StepProgram:
  """The one-step and scanned programs of ``step_fn``, state donated.

  Args:
    step_fn: ``(state, batch, step, extra) -> (state, metrics)``, pure.
    make_batch: ``(data, feed) -> batch``, pure.
    data, place, extra: as :class:`StepProgram` holds them.
  """
  def one(state, data, feed, step, extra):
    return step_fn(state, make_batch(data, feed), step, extra)

  def many(state, data, feeds, steps, extra):
    return jax.lax.scan(
        lambda state, xs: one(state, data, xs[0], xs[1], extra), state,
        (feeds, steps))

  return StepProgram(jax.jit(one, donate_argnums=(0,)),
                     jax.jit(many, donate_argnums=(0,)), data, place, extra)


def describe(pipeline: str, steps_per_dispatch: int,
             config: ml_collections.ConfigDict) -> str:
  """E.g. ``data pipeline device, 8 steps per dispatch, precision
  bfloat16``: the run's speed settings, for its log."""
  return (f"data pipeline {pipeline}, {steps_per_dispatch} "
          f"step{'s' if steps_per_dispatch != 1 else ''} per dispatch, "
          f"precision {config.get('precision', 'float32')}")
