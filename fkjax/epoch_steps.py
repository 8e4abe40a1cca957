"""The training steps of one epoch, for one run (``fkjax.train``) or a sweep
of runs stepped as one program (``fkjax.sweep``).

What the two loops share: a progress bar over the epoch's batches, metrics
read one step late (so that the host prepares the next batch while the
device still runs this step; reading them at once would wait for the device
every step), mid-epoch checkpoints of a state whose loss was checked first,
and the throughput after the epoch's first step, which includes compilation.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Iterable, Mapping

import jax

from fkjax import metric_logging

PyTree = Any


@dataclasses.dataclass
class EpochSteps:
  """What the steps of an epoch leave.

  Attributes:
    state: the training state after the last step.
    steps: steps run by this call (a resumed epoch's skipped ones excluded).
    steady_seconds: wall time from reading the first step's metrics to the
      end (compilation excluded); None with fewer than two steps.
  """

  state: PyTree
  steps: int
  steady_seconds: float | None

  def images_per_second(self, batch_size: int) -> float | None:
    """Throughput after the first step, in images of ``batch_size``."""
    if not self.steady_seconds:
      return None
    return (self.steps - 1) * batch_size / self.steady_seconds


def run_epoch_steps(
    state: PyTree, batches: Iterable[Any], *, first_step: int, skip: int,
    steps_per_epoch: int,
    step_fn: Callable[[PyTree, Any, int], tuple[PyTree, Any]],
    on_metrics: Callable[[int, Any], Mapping[str, str]],
    save: Callable[[int, PyTree], None], checkpoint_every: int, desc: str,
    progress: bool) -> EpochSteps:
  """Runs ``step_fn`` over ``batches``, the rest of one epoch.

  Args:
    state: the training state.
    batches: the epoch's batches, all of them (the first ``skip`` are
      dropped).
    first_step: the global step of the epoch's first batch.
    skip: steps of this epoch done before (resuming mid-epoch).
    steps_per_epoch: steps of a whole epoch.
    step_fn: ``(state, batch, step) -> (state, metrics)``, the jitted step.
    on_metrics: called with ``(step, metrics on the host)`` for every step,
      one step late; checks the loss (raising stops the epoch) and returns
      the progress bar's postfix.
    save: ``(step, state)``, a mid-epoch checkpoint.
    checkpoint_every: steps between mid-epoch checkpoints; 0: none.
    desc: the progress bar's label.
    progress: whether to show progress (see
      :func:`fkjax.metric_logging.progress`).
  """
  bar = metric_logging.progress(
      itertools.islice(batches, skip, None), total=steps_per_epoch, initial=skip, desc=desc, unit="step",
      disable=not progress, leave=False)
  consumed = 0
  first_done = None

  def consume(step: int, metrics: Any) -> None:
    nonlocal consumed, first_done
    metrics = jax.device_get(metrics)
    consumed += 1
    if consumed == 1:
      first_done = time.perf_counter()
    bar.set_postfix(on_metrics(step, metrics))

  pending = None
  done = skip
  for batch in bar:
    step = first_step + done
    state, metrics = step_fn(state, batch, step)
    if pending is not None:
      consume(*pending)
    pending = (step, metrics)
    done += 1
    if (checkpoint_every and (step + 1) % checkpoint_every == 0
        and done < steps_per_epoch):
      consume(*pending)   # never checkpoint a state with a non-finite loss
      pending = None
      save(step + 1, state)
  if pending is not None:
    consume(*pending)
  bar.close()
  steady = time.perf_counter() - first_done if consumed > 1 else None
  return EpochSteps(state, consumed, steady)
