"""The training steps of one epoch, for one run (``fkjax.training.train``) or a sweep
of runs stepped as one program (``fkjax.training.sweep``).

What the two loops share: a progress bar over the epoch's batches, several
steps per dispatch (``config.training.steps_per_dispatch``), metrics read
one dispatch late (so that the host prepares the next batches while the
device still runs these steps; reading them at once would wait for the
device every dispatch), mid-epoch checkpoints of a state whose loss was
checked first, and the throughput after the epoch's first dispatch, which
includes compilation.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax

from fkjax.workdir import metric_logging

PyTree = Any


@dataclasses.dataclass
class EpochSteps:
  """What the steps of an epoch leave.

  Attributes:
    state: the training state after the last step.
    steps: steps run by this call (a resumed epoch's skipped ones excluded).
    steady_seconds: wall time from reading the first dispatch's metrics to
      the end (compilation excluded); None with a single dispatch.
    steady_steps: the steps run in ``steady_seconds``.
  """

  state: PyTree
  steps: int
  steady_seconds: float | None
  steady_steps: int = 0

  def images_per_second(self, batch_size: int) -> float | None:
    """Throughput after the first dispatch, in images of ``batch_size``."""
    if not self.steady_seconds:
      return None
    return self.steady_steps * batch_size / self.steady_seconds


def dispatch_size(done: int, *, first_step: int, steps_per_dispatch: int,
                  scan_limit: int, checkpoint_every: int) -> int:
  """Steps of the next dispatch, ``done`` steps into the epoch: the whole
  ``steps_per_dispatch`` where they all have full batches (the first
  ``scan_limit`` steps of the epoch) and no mid-epoch checkpoint falls
  between two of them; else 1, so that each checkpoint's step is reached."""
  k = steps_per_dispatch
  if k <= 1 or done + k > scan_limit:
    return 1
  step = first_step + done
  # a save follows step j where (j + 1) % checkpoint_every == 0: none may
  # follow one of the dispatch's steps but its last
  if checkpoint_every and (step + k - 1) // checkpoint_every != (
      step // checkpoint_every):
    return 1
  return k


def run_epoch_steps(
    state: PyTree, batches: Iterable[Any], *, first_step: int, skip: int,
    steps_per_epoch: int,
    step_fn: Callable[[PyTree, Sequence[Any], int], tuple[PyTree, Any]],
    on_metrics: Callable[[int, Any], Mapping[str, str]],
    save: Callable[[int, PyTree], None], checkpoint_every: int, desc: str,
    progress: bool, steps_per_dispatch: int = 1,
    scan_limit: int | None = None) -> EpochSteps:
  """Runs ``step_fn`` over ``batches``, the rest of one epoch.

  Args:
    state: the training state.
    batches: the epoch's batches (or whatever ``step_fn`` makes batches
      of), all of them (the first ``skip`` are dropped).
    first_step: the global step of the epoch's first batch.
    skip: steps of this epoch done before (resuming mid-epoch).
    steps_per_epoch: steps of a whole epoch.
    step_fn: ``(state, batches, step) -> (state, metrics)``: the steps
      ``step, step + 1, ...`` on the list ``batches``, in one dispatch; with
      more than one batch, every leaf of ``metrics`` has a leading axis of
      one entry per step.
    on_metrics: called with ``(step, metrics on the host)`` for every step,
      one dispatch late; checks the loss (raising stops the epoch) and
      returns the progress bar's postfix.
    save: ``(step, state)``, a mid-epoch checkpoint.
    checkpoint_every: steps between mid-epoch checkpoints; 0: none.
    desc: the progress bar's label.
    progress: whether to show progress (see
      :func:`fkjax.workdir.metric_logging.progress`).
    steps_per_dispatch: steps per call of ``step_fn`` where
      :func:`dispatch_size` allows.
    scan_limit: the steps of the epoch whose batches have the full size
      (default all).
  """
  scan_limit = steps_per_epoch if scan_limit is None else scan_limit
  bar = metric_logging.progress(
      None, total=steps_per_epoch, initial=skip, desc=desc, unit="step",
      disable=not progress, leave=False)
  todo = itertools.islice(batches, skip, steps_per_epoch)
  consumed = steady_from = 0
  first_done = None

  def consume(step: int, count: int, metrics: Any) -> None:
    nonlocal consumed, first_done, steady_from
    metrics = jax.device_get(metrics)
    for i in range(count):
      one = metrics if count == 1 else jax.tree.map(lambda x, i=i: x[i],
                                                    metrics)
      postfix = on_metrics(step + i, one)
    consumed += count
    if first_done is None:
      first_done, steady_from = time.perf_counter(), consumed
    bar.set_postfix(postfix)
    bar.update(count)

  pending = None
  done = skip
  while done < steps_per_epoch:
    step = first_step + done
    count = dispatch_size(done, first_step=first_step,
                          steps_per_dispatch=steps_per_dispatch,
                          scan_limit=scan_limit,
                          checkpoint_every=checkpoint_every)
    chunk = list(itertools.islice(todo, count))
    if not chunk:
      break
    state, metrics = step_fn(state, chunk, step)
    if pending is not None:
      consume(*pending)
    pending = (step, len(chunk), metrics)
    done += len(chunk)
    last = step + len(chunk) - 1
    if (checkpoint_every and (last + 1) % checkpoint_every == 0
        and done < steps_per_epoch):
      consume(*pending)   # never checkpoint a state with a non-finite loss
      pending = None
      save(last + 1, state)
  if pending is not None:
    consume(*pending)
  bar.close()
  steady = (time.perf_counter() - first_done
            if consumed > steady_from else None)
  return EpochSteps(state, consumed, steady, consumed - steady_from)
