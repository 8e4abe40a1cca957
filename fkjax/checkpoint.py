"""Orbax checkpoints: the latest states (to resume) and the best one.

All checkpoints live in ``<workdir>/checkpoints/<step>/``, managed by one
orbax ``CheckpointManager`` whose preservation policy keeps

* the latest ``KEEP_LATEST`` (2) checkpoints, whatever they are, and
* the one with the highest validation accuracy among the end-of-epoch
  checkpoints (``save(..., val_accuracy=...)``). Mid-epoch checkpoints carry
  no metric: they never count as, nor displace, the best one.

One save per epoch writes both roles, so no crash can leave "latest" and
"best" out of step. Orbax writes each checkpoint into a temporary directory
and renames it when complete: a process killed during a save (even
``kill -9``) leaves the previous checkpoints intact; the partial directory
(``*.orbax-checkpoint-tmp*``) is removed the next time training opens the
workdir.

Every checkpoint records a SHA-256 digest of each array in its orbax step
metadata (``_CHECKPOINT_METADATA``, written inside the temporary directory,
so it is committed with the arrays). ``restore`` recomputes the digests and
checks that floating-point values are finite, so bytes damaged on disk raise
``CheckpointError`` instead of restoring garbage. A checkpoint whose digests
cannot be read (its metadata file deleted, not JSON, or holding none) cannot
be verified and is refused, saying which, unless the caller allows it
(``allow_unverified=True``; on the command line
``--allow_unverified_checkpoint`` or ``FKJAX_ALLOW_UNVERIFIED_CHECKPOINT=1``):
anyone who can rewrite the arrays can delete their digests too.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import pathlib
import re
import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_policies

# Checkpoints kept besides the best one.
KEEP_LATEST = 2
# Key of fkjax's entry in orbax's per-step custom metadata.
_METADATA_KEY = "fkjax"
_DIGEST_FORMAT = "sha256-v1"
# orbax's per-step metadata file, which holds the digests.
_STEP_METADATA = "_CHECKPOINT_METADATA"
ALLOW_UNVERIFIED_ENV = "FKJAX_ALLOW_UNVERIFIED_CHECKPOINT"
ALLOW_UNVERIFIED_FLAG = "--allow_unverified_checkpoint"
# errnos that mean "the disk cannot take more": the user must free space.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# Tensorstore's way of naming the errno in its error text.
_TS_ERRNO = re.compile(r"os_error_code='?(\d+)")


class CheckpointError(RuntimeError):
  """A checkpoint is missing, corrupt, unwritable, or does not match."""


class _DropMetriclessWarning(logging.Filter):
  """Mid-epoch saves deliberately carry no metric; orbax warns on each.

  Installed around fkjax's own saves only: importing fkjax leaves the
  ``absl`` logger as it was.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    return "did not provide metrics" not in str(record.msg)


class _DropStepMetadataComplaints(logging.Filter):
  """Orbax logs, then ignores, a step metadata file that is missing or not
  JSON when it opens a directory; ``restore`` refuses such a step in one
  line of its own (``_read_digests``), and only the step it restores."""

  _TEXTS = ("Metadata file does not exist", "Failed to json parse Metadata",
            "Failed to read Metadata file")

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(self._TEXTS)


class _HeldLogRecords(logging.Filter):
  """Holds back orbax's errors during a save.

  A failed write makes every orbax worker thread log its own traceback (a
  full disk gave ~1,000 lines); ``save`` raises one clear error for I/O
  failures instead, and replays the held records otherwise.
  """

  def __init__(self):
    super().__init__()
    self.records: list[logging.LogRecord] = []

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:
      self.records.append(record)
      return False
    return True

  def replay(self, logger: logging.Logger) -> None:
    """Stops holding and emits what was held."""
    logger.removeFilter(self)
    for record in self.records:
      logger.handle(record)
    self.records = []


def _preservation_policy() -> Any:
  return ocp_policies.AnyPreservationPolicy([
      ocp_policies.LatestN(n=KEEP_LATEST),
      # keep_checkpoints_without_metrics=False: mid-epoch checkpoints are
      # kept only while LatestN wants them.
      ocp_policies.BestN(get_metric_fn=_metric, reverse=False, n=1,
                         keep_checkpoints_without_metrics=False),
  ])


def _metric(metrics: Any) -> float:
  return float(metrics["val_accuracy"])


def _manager(directory: str, read_only: bool) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      preservation_policy=_preservation_policy(),
      # best_fn makes orbax store the metrics and answer best_step().
      best_fn=_metric,
      best_mode="max",
      # Not orbax's read_only mode, which warns about its own defaults;
      # Checkpointer.save refuses instead.
      create=not read_only,
      cleanup_tmp_directories=not read_only,
      # Saves are rare (once an epoch) and must be complete before a crash
      # test or eval reads them, so keep them synchronous.
      enable_async_checkpointing=False,
  )
  return ocp.CheckpointManager(directory, options=options)


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


class Checkpointer:
  """Saves and restores training states under ``<workdir>/checkpoints``.

  Args:
    workdir: the run's directory.
    must_exist: open for reading only (eval): raise ``CheckpointError`` if
      the workdir has no checkpoints, and leave temporary directories alone
      (a training process may be writing one).
    allow_unverified: restore a checkpoint whose digests cannot be read
      (with a warning) instead of refusing it; None: whether
      ``FKJAX_ALLOW_UNVERIFIED_CHECKPOINT`` is set (to anything but 0).
  """

  def __init__(self, workdir: str, must_exist: bool = False,
               allow_unverified: bool | None = None):
    if allow_unverified is None:
      allow_unverified = os.environ.get(ALLOW_UNVERIFIED_ENV, "") not in (
          "", "0")
    self.allow_unverified = allow_unverified
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    if must_exist:
      require_checkpoints(workdir)
    self._read_only = must_exist
    quiet = _DropStepMetadataComplaints()
    logging.getLogger("absl").addFilter(quiet)
    try:
      self._manager = _manager(self.directory, read_only=must_exist)
    finally:
      logging.getLogger("absl").removeFilter(quiet)

  def save(self, step: int, state: Any, val_accuracy: float | None = None
           ) -> None:
    """Saves ``state`` at ``step``; with ``val_accuracy``, as a best candidate.

    Raises:
      CheckpointError: the disk is full or the directory is not writable
        (one clear line instead of orbax's traceback); the previous
        checkpoints are intact.
    """
    if self._read_only:
      raise CheckpointError(
          f"{self.directory} was opened for reading (must_exist=True)")
    metrics = None
    if val_accuracy is not None and math.isfinite(float(val_accuracy)):
      metrics = {"val_accuracy": float(val_accuracy)}
    digests = _digests(state)
    held = _HeldLogRecords()
    metricless = _DropMetriclessWarning()
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(metricless)
    absl_logger.addFilter(held)
    try:
      self._manager.save(
          step, args=ocp.args.StandardSave(state), metrics=metrics,
          force=True, custom_metadata={_METADATA_KEY: {
              "format": _DIGEST_FORMAT, "digests": digests}})
      self._manager.wait_until_finished()
    except Exception as e:  # orbax wraps I/O errors in many types
      cause = _os_error(e)
      if cause is None:  # not an I/O failure: show orbax's own logs
        held.replay(absl_logger)
        raise
      target = os.path.join(self.directory, str(step))
      if cause.errno in _NO_SPACE:
        raise CheckpointError(
            f"no space left on device while saving checkpoint step {step} to "
            f"{target}; free space and rerun the same command to resume "
            "(the previous checkpoints are intact)") from e
      raise CheckpointError(
          f"could not write checkpoint step {step} to {target}: "
          f"{_describe_os_error(cause)}; fix this and rerun the same command "
          "to resume (the previous checkpoints are intact)") from e
    finally:
      absl_logger.removeFilter(held)  # I/O errors: the held records go
      absl_logger.removeFilter(metricless)
    held.replay(absl_logger)

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
    where = self.step_dir(step)
    # Before orbax reads the step: it logs, and then ignores, a missing or
    # unparsable metadata file.
    saved = self._saved_digests(step, which)
    want, stored = _shapes_by_path(template), _stored_shapes(where)
    _check_stored_shapes(want, stored, where)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    quiet = _DropStepMetadataComplaints()   # said by _saved_digests
    logging.getLogger("absl").addFilter(quiet)
    try:
      state = self._manager.restore(step,
                                    args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # orbax raises many types; name the cause
      _drop_orbax_leftovers()
      other_arrays = _other_arrays(want, stored)
      if other_arrays:
        raise CheckpointError(
            f"checkpoint {where} does not match the config's "
            f"model/optimizer: {other_arrays}; was it written with another "
            "config?") from e
      # orbax's messages run over several lines: the first says what, up
      # to tensorstore's dump of its internals.
      first = (str(e).strip().splitlines() or [""])[0]
      first = first.split(" See full TensorStore details")[0]
      raise CheckpointError(
          f"could not restore the {which} checkpoint at step {step} from "
          f"{where}: {type(e).__name__}: {first} Is it complete, and was it "
          "written with the same model/optimizer config? If it is damaged, "
          f"delete {where} to use the previous checkpoint") from e
    finally:
      logging.getLogger("absl").removeFilter(quiet)
    _check_same_structure(template, state, where)
    self._verify(step, state, which, saved)
    return step, state

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
    path = os.path.join(self.step_dir(step), _STEP_METADATA)
    problem, digests = _read_digests(path)
    if problem is None:
      return digests
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
    where = self.step_dir(step)
    remedy = self._remedy(step)
    if saved is not None:
      got = _digests(state)
      want = saved
      bad = [k for k in sorted(set(got) | set(want))
             if got.get(k) is not None and want.get(k) is not None
             and got[k] != want[k]]
      missing = sorted(set(got) ^ set(want))
      if bad or missing:
        names = ", ".join((bad + missing)[:3])
        raise CheckpointError(
            f"the {which} checkpoint step {step} is corrupt: the arrays "
            f"read from {where} differ from those saved ({names}"
            f"{', ...' if len(bad) + len(missing) > 3 else ''}); {remedy}")
    nonfinite = _nonfinite_leaves(state)
    if nonfinite:
      raise CheckpointError(
          f"the {which} checkpoint step {step} in {where} holds non-finite "
          f"values ({', '.join(nonfinite[:3])}"
          f"{', ...' if len(nonfinite) > 3 else ''}); {remedy}")

  def close(self) -> None:
    self._manager.close()


# --------------------------------------------------------------------------
# Digests and finiteness of a state's arrays.


def _read_digests(path: str) -> tuple[str | None, dict[str, Any]]:
  """``(None, {leaf path: digest})`` from a step's metadata file, or
  ``(what is wrong, {})``."""
  try:
    with open(path, "rb") as f:
      text = f.read()
  except FileNotFoundError:
    return (f"its metadata file {path}, which holds the digests of its "
            "arrays, is missing (deleted?)"), {}
  except OSError as e:
    return f"its metadata file {path} is unreadable ({e.strerror})", {}
  try:
    metadata = json.loads(text)
  except ValueError as e:
    return (f"its metadata file {path}, which holds the digests of its "
            f"arrays, is not valid JSON ({' '.join(str(e).split())})"), {}
  entry = ((metadata.get("custom_metadata") or {}).get(_METADATA_KEY)
           if isinstance(metadata, dict) else None)
  if not (isinstance(entry, dict) and entry.get("format") == _DIGEST_FORMAT
          and isinstance(entry.get("digests"), dict)):
    return (f"its metadata file {path} holds no digests of its arrays "
            "(removed, or written by an fkjax from before digests)"), {}
  return None, entry["digests"]


def _local_value(x: Any) -> np.ndarray | None:
  """The whole array on this host, or None where it is split across hosts."""
  if isinstance(x, jax.Array):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if not x.is_fully_addressable:
      if not x.sharding.is_fully_replicated:
        return None
      x = x.addressable_data(0)
  return np.ascontiguousarray(np.asarray(jax.device_get(x)))


def _digests(state: Any) -> dict[str, str | None]:
  """``{leaf path: sha256 of dtype, shape and bytes}`` (None: not local)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    value = _local_value(leaf)
    if value is None:
      out[jax.tree_util.keystr(path)] = None
      continue
    h = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode())
    h.update(value.reshape(-1).view(np.uint8))
    out[jax.tree_util.keystr(path)] = h.hexdigest()
  return out


def _nonfinite_leaves(state: Any) -> list[str]:
  bad = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    if not jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
      continue
    shards = ([s.data for s in leaf.addressable_shards]
              if isinstance(leaf, jax.Array) else [leaf])
    if not all(np.all(np.isfinite(np.asarray(s))) for s in shards):
      bad.append(jax.tree_util.keystr(path))
  return bad


def _check_same_structure(template: Any, state: Any, where: str) -> None:
  want = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), template)
  got = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), state)
  if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
    raise CheckpointError(
        f"checkpoint {where} does not match the config's model/optimizer: "
        "different parameter structure or shapes")


_Shapes = dict[tuple[str, ...], tuple[int, ...]]


def _path_entry(key: Any) -> str:
  """A dict key, attribute name or index as a plain string."""
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _shapes_by_path(tree: Any) -> _Shapes:
  """``{path: shape}`` of a tree's array leaves, each path entry a plain
  string, so that a state and the metadata orbax kept of it compare."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if getattr(leaf, "shape", None) is None:
      continue
    out[tuple(_path_entry(k) for k in path)] = tuple(leaf.shape)
  return out


def _stored_shapes(where: str) -> _Shapes | None:
  """The checkpoint's ``{path: shape}`` from its metadata (None: unreadable)."""
  reader = ocp.StandardCheckpointHandler()
  try:
    # The manager keeps its one item under "default".
    return _shapes_by_path(
        reader.metadata(pathlib.Path(os.path.abspath(where), "default")))
  except Exception:  # pylint: disable=broad-except
    return None
  finally:
    reader.close()


def _drop_orbax_leftovers() -> None:
  """From now on, what orbax's failed reads report when their coroutines
  are collected (pages of tensorstore internals, some of them only after
  the restore has raised) or when they complete after it (a traceback of
  "Event loop is closed") is dropped: the restore's error says it in one
  line. Anything else goes to the hook in place before. Installed once, by
  the first restore that fails (importing fkjax, saving and restoring
  intact checkpoints change nothing); it stays, since the reports come at
  any moment after the error (without it, a truncated chunk's restore
  printed ~60 lines after its one-line error in 3 runs of 9)."""
  if getattr(sys.unraisablehook, "_fkjax_drops_orbax_leftovers", False):
    return
  before = sys.unraisablehook

  def hook(unraisable):
    if not _is_orbax_leftover(unraisable):
      before(unraisable)
  hook._fkjax_drops_orbax_leftovers = True
  sys.unraisablehook = hook


def _is_orbax_leftover(unraisable: Any) -> bool:
  """Whether an unraisable exception is what a failed orbax read leaves:
  its coroutine, collected, or the completion callback of a read that
  finished after the restore had raised and closed its event loop
  (tensorstore reports that one with no object, at any moment around the
  restore's error)."""
  code = getattr(unraisable.object, "cr_code", None)
  if code is not None:
    return "orbax" in code.co_filename
  if unraisable.object is not None or not (
      isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == "Event loop is closed"):
    return False
  tb = unraisable.exc_traceback
  while tb is not None:
    if tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
      return True
    tb = tb.tb_next
  return False


def _other_arrays(want: _Shapes, stored: _Shapes | None) -> str:
  """What the checkpoint (``stored``) has that the config's state (``want``)
  lacks and the reverse, in a few words ("" if the same arrays, or
  unknown)."""
  if stored is None:
    return ""
  parts = []
  for keys, says in ((sorted(set(want) - set(stored)),
                      "the config has {} that the checkpoint lacks"),
                     (sorted(set(stored) - set(want)),
                      "the checkpoint has {} that the config lacks")):
    if keys:
      more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
      parts.append(says.format("/".join(keys[0]) + more))
  return "; ".join(parts)


def _check_stored_shapes(want: _Shapes, stored: _Shapes | None,
                         where: str) -> None:
  """Refuses a checkpoint whose arrays have other shapes than the config's
  state (``want``), from its metadata alone.

  Restoring it would fail too, but inside orbax's concurrent reads: the
  reads that fail after the first leave asyncio tracebacks on stderr at
  exit, after the one-line error. Where the metadata cannot be read or
  names other arrays, the restore itself decides.
  """
  if stored is None or set(stored) != set(want):
    return
  differ = [k for k in want if stored[k] != want[k]]
  if differ:
    first = differ[0]
    raise CheckpointError(
        f"checkpoint {where} does not match the config's model/optimizer: "
        f"{'/'.join(first)} has shape {stored[first]} there and "
        f"{want[first]} in the config"
        + (f" ({len(differ) - 1} more arrays differ)" if len(differ) > 1
           else "")
        + "; was it written with another config?")


def has_checkpoints(workdir: str) -> bool:
  """Whether ``workdir`` holds a run's checkpoints (any complete step)."""
  root = os.path.join(workdir, "checkpoints")
  return os.path.isdir(root) and any(
      name.isdigit() for name in os.listdir(root))


# --------------------------------------------------------------------------
# I/O errors.


def _os_error(e: BaseException) -> OSError | None:
  """The OSError behind ``e`` (its cause/context chain), if any.

  Tensorstore reports write failures as ``ValueError``s whose text carries
  the system message; those are mapped to an ``OSError`` with its errno.
  """
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno is not None:
      return e
    text = str(e)
    match = _TS_ERRNO.search(text)
    if match:
      code = int(match.group(1))
      return OSError(code, os.strerror(code))
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
      if os.strerror(code) in text:
        return OSError(code, os.strerror(code))
    e = e.__cause__ or e.__context__
  return None


def _describe_os_error(e: OSError) -> str:
  text = e.strerror or os.strerror(e.errno or 0)
  return f"{text} ({e.filename})" if e.filename else text

