"""``Checkpointer``: a run's checkpoints saved, kept and restored by orbax.

Orbax's ``CheckpointManager`` does the keeping (its preservation policies),
the best step (``best_fn``), the atomic writes and the clean-up of partial
ones; this class adds what guards a user: each restore verified
(:mod:`~fkjax.checkpoint.digests`), checked against the config's shapes
(:mod:`~fkjax.checkpoint.shapes`), and every failure said in one line
(:mod:`~fkjax.checkpoint.errors`, :mod:`~fkjax.checkpoint.quiet`).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Any, Callable, Iterator

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_policies

from fkjax import environment
from fkjax.checkpoint import digests
from fkjax.checkpoint import errors
from fkjax.checkpoint import quiet
from fkjax.checkpoint import run_record
from fkjax.checkpoint import shapes
from fkjax.checkpoint import writing
from fkjax.checkpoint.errors import CheckpointError

# Checkpoints kept besides the best one.
KEEP_LATEST = 2
ALLOW_UNVERIFIED_ENV = "FKJAX_ALLOW_UNVERIFIED_CHECKPOINT"
ALLOW_UNVERIFIED_FLAG = "--allow_unverified_checkpoint"


def _metric(metrics: Any) -> float:
  return float(metrics["val_accuracy"])


def _options(read_only: bool, asynchronous: bool
             ) -> ocp.CheckpointManagerOptions:
  return ocp.CheckpointManagerOptions(
      preservation_policy=ocp_policies.AnyPreservationPolicy([
          ocp_policies.LatestN(n=KEEP_LATEST),
          # Mid-epoch checkpoints (no metric) are kept only while LatestN
          # wants them.
          ocp_policies.BestN(get_metric_fn=_metric, reverse=False, n=1,
                             keep_checkpoints_without_metrics=False),
      ]),
      # best_fn makes orbax store the metrics and answer best_step().
      best_fn=_metric,
      best_mode="max",
      # Not orbax's read_only mode, which warns about its own defaults;
      # Checkpointer.save refuses instead.
      create=not read_only,
      cleanup_tmp_directories=not read_only,
      # Asynchronous: orbax copies the arrays to the host before save()
      # returns (the caller may then donate them) and writes the files on
      # its threads while training goes on.
      enable_async_checkpointing=asynchronous,
  )


def require_checkpoints(workdir: str) -> None:
  """Raises ``CheckpointError`` unless ``workdir`` has train.py's checkpoints.

  For readers to call before they write anything into ``workdir`` (eval.py's
  lock file), so that a directory that is no run, such as a run kept under
  ``results/`` without its checkpoints, is left as it was.
  """
  directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
  if not os.path.isdir(directory):
    raise CheckpointError(
        f"no checkpoints in {os.path.abspath(workdir)!r}: expected the "
        f"directory {directory!r} written by train.py")


def has_checkpoints(workdir: str) -> bool:
  """Whether ``workdir`` holds a run's checkpoints (any complete step)."""
  root = os.path.join(workdir, "checkpoints")
  return os.path.isdir(root) and any(
      name.isdigit() for name in os.listdir(root))


class Checkpointer:
  """Saves and restores training states under ``<workdir>/checkpoints``.

  A context manager: ``with Checkpointer(workdir, must_exist=True) as c:``
  restores for reading and closes the manager after.

  Args:
    workdir: the run's directory.
    must_exist: open for reading only (eval): raise ``CheckpointError`` if
      the workdir has no checkpoints, and leave temporary directories alone
      (a training process may be writing one).
    allow_unverified: restore a checkpoint whose digests cannot be read
      (with a warning) instead of refusing it; None: whether
      ``FKJAX_ALLOW_UNVERIFIED_CHECKPOINT`` is set (to anything but 0).
    asynchronous: ``save`` returns once the arrays are copied to the host
      and the files are written in the background (the training loop's
      saves); the write is complete, or its failure raised, at the next
      ``save``, ``wait`` or ``close``. False: complete when ``save``
      returns.
  """

  def __init__(self, workdir: str, must_exist: bool = False,
               allow_unverified: bool | None = None,
               asynchronous: bool = False):
    if allow_unverified is None:
      allow_unverified = environment.enabled(ALLOW_UNVERIFIED_ENV)
    self.allow_unverified = allow_unverified
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    if must_exist:
      require_checkpoints(workdir)
    self._read_only = must_exist
    self._asynchronous = asynchronous and not must_exist
    # The last save's step and orbax's error records held until it ends.
    self._pending: tuple[int, list[Any], Callable[[], None]] | None = None
    self._held = contextlib.ExitStack()
    with quiet.dropping(quiet.METADATA_COMPLAINTS):
      # The handler named up front, so that a reader that has saved nothing
      # gets the arrays' metadata too (shapes.stored).
      self._manager = ocp.CheckpointManager(
          self.directory, item_handlers=ocp.StandardCheckpointHandler(),
          options=_options(read_only=must_exist,
                           asynchronous=self._asynchronous))

  def save(self, step: int, state: Any, val_accuracy: float | None = None
           ) -> None:
    """Saves ``state`` at ``step``; with ``val_accuracy``, as a best candidate.

    Raises:
      CheckpointError: the disk is full or the directory is not writable
        (one clear line instead of orbax's traceback), for this save or
        the asynchronous one before it; the previous checkpoints are
        intact.
    """
    if self._read_only:
      raise CheckpointError(
          f"{self.directory} was opened for reading (must_exist=True)")
    self.wait()
    metrics = None
    if val_accuracy is not None and math.isfinite(float(val_accuracy)):
      metrics = {"val_accuracy": float(val_accuracy)}
    metadata = digests.custom_metadata(state)
    # The run's config beside the digests: a resume whose config.json was
    # deleted is checked against it (fkjax.config.record).
    metadata[run_record.METADATA_KEY].update(
        run_record.of_workdir(os.path.dirname(self.directory)))
    # Orbax's threads log a failed write's tracebacks as they go: held
    # until wait(), which says the failure in one line instead.
    # The write's threads report its failure as tensorstore's callbacks
    # meet a closed event loop: dropped until wait() has said it.
    self._held = contextlib.ExitStack()
    keep_dropping = self._held.enter_context(quiet.leftovers_dropped())
    held = self._held.enter_context(quiet.errors_held(orbax_only=True))
    try:
      # Ctrl-C: the save is abandoned, the previous checkpoints are intact.
      with self._writing(step):
        self._manager.save(step, args=ocp.args.StandardSave(state),
                           metrics=metrics, force=True,
                           custom_metadata=metadata)
    except BaseException:
      held.clear()
      keep_dropping()
      self._held.close()
      raise
    self._pending = (step, held, keep_dropping)
    if not self._asynchronous:
      self.wait()

  def wait(self) -> None:
    """Returns once the last save is on disk (at once if it was
    synchronous or has finished).

    Raises:
      CheckpointError: its write failed (one line naming its step).
    """
    if self._pending is None:
      return
    (step, held, keep_dropping), self._pending = self._pending, None
    try:
      with self._writing(step):
        self._manager.wait_until_finished()
    except BaseException:
      held.clear()   # said in one line
      keep_dropping()
      raise
    finally:
      self._held.close()

  @contextlib.contextmanager
  def _writing(self, step: int) -> Iterator[None]:
    """Orbax's write of ``step`` (or the wait for it): its failure in one
    line (:func:`writing.one_line`), its metric-less warning dropped."""
    with quiet.dropping(quiet.METRICLESS), writing.one_line(
        lambda cause: errors.write_error(step, self.step_dir(step), cause),
        wait=self._manager.wait_until_finished):
      yield

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The end-of-epoch step with the highest validation accuracy."""
    return self._manager.best_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def restore(self, template: Any, which: str = "latest",
              step: int | None = None) -> tuple[int, Any]:
    """Restores into the structure, shapes and shardings of ``template``.

    Args:
      template: a state of the expected structure (arrays or
        ``jax.ShapeDtypeStruct``s).
      which: ``"latest"`` or ``"best"``.
      step: a specific step; default the latest (or best) one.

    Returns:
      ``(step, state)``.

    Raises:
      CheckpointError: nothing to restore; the checkpoint does not match
        ``template`` (another model or optimizer than the config says); it
        cannot be read; or its values differ from those saved (corrupt) or
        are not finite.
    """
    if which not in ("latest", "best"):
      raise ValueError(f"which must be 'latest' or 'best', not {which!r}")
    if step is None:
      step = self.best_step() if which == "best" else self.latest_step()
    if step is None:
      raise CheckpointError(
          f"no {which} checkpoint in {self.directory}" +
          (" (none has finished an epoch yet)" if which == "best" else ""))
    # Before orbax reads the step, which would log, then ignore, a missing
    # or unparsable metadata file.
    saved = self._saved_digests(step, which)
    with quiet.dropping(quiet.METADATA_COMPLAINTS):
      state = self._read(step, which, template)
    self._verify(step, state, which, saved)
    return step, state

  def _read(self, step: int, which: str, template: Any) -> Any:
    """Orbax's restore of ``step``, its failures said in one line."""
    where = self.step_dir(step)
    want = shapes.of_tree(template)
    saved = shapes.stored(self._manager, step)
    shapes.check(want, saved, where)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
      with quiet.leftovers_dropped():
        return self._manager.restore(step,
                                     args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # orbax raises many types; name the cause
      raise (shapes.other_arrays(want, saved, where)
             or errors.restore_error(which, step, where, e)) from e

  def _remedy(self, step: int) -> str:
    where = self.step_dir(step)
    others = [s for s in self.all_steps() if s != step]
    return (f"delete {where} and rerun to fall back to another checkpoint "
            f"(steps {', '.join(map(str, others))})" if others else
            f"it is the only checkpoint: deleting {where} restarts "
            "training from scratch")

  def _saved_digests(self, step: int, which: str) -> dict[str, Any] | None:
    """The digests saved with ``step``; None where they cannot be read and
    unverified checkpoints are allowed (else ``CheckpointError``)."""
    problem, saved = digests.read_saved(self.step_dir(step))
    if problem is None:
      return saved
    what = (f"the {which} checkpoint step {step} cannot be verified: "
            f"{problem}")
    if self.allow_unverified:
      logging.getLogger(__name__).warning(
          "%s; restoring it unverified, as allowed", what)
      return None
    raise CheckpointError(
        f"{what}. Its arrays may have been altered: {self._remedy(step)}; "
        f"or, if you trust it, rerun with {ALLOW_UNVERIFIED_FLAG} "
        f"({ALLOW_UNVERIFIED_ENV}=1) to use it unverified")

  def _verify(self, step: int, state: Any, which: str,
              saved: dict[str, Any] | None) -> None:
    """Refuses a restored state unlike the one saved, or not finite."""
    where = self.step_dir(step)
    for bad, says in (
        (digests.differing(saved, state) if saved is not None else [],
         f"is corrupt: the arrays read from {where} differ from those "
         "saved"),
        (digests.nonfinite_leaves(state),
         f"in {where} holds non-finite values")):
      if bad:
        more = ", ..." if len(bad) > 3 else ""
        raise CheckpointError(
            f"the {which} checkpoint step {step} {says} "
            f"({', '.join(bad[:3])}{more}); {self._remedy(step)}")

  def close(self) -> None:
    """Waits for an asynchronous save (raising its failure), then closes."""
    try:
      self.wait()
    finally:
      self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()
