"""A workdir's lock and its results files.

Lock
  ``WorkdirLock(workdir)`` holds an ``fcntl.flock`` on ``<workdir>/fkjax.lock``
  so that a second training process on the same workdir stops at once with
  ``<workdir> is in use by process PID (command) on HOST since TIME; wait for
  it or stop it``. The kernel releases the lock when the holding process ends,
  however it ends (``kill -9`` included), so a stale lock file never blocks:
  the pid/host/time written into it only serve the message. ``shared=True``
  takes a shared lock: any number of shared holders (evaluations) may run
  together, but not alongside an exclusive holder (training). With
  ``jax.distributed`` only process 0 should take the lock. On a filesystem
  without ``flock`` support the lock warns and does nothing. A run that
  fails before it writes anything (bad data, a download error) leaves
  nothing behind: releasing an exclusive lock on a workdir that holds only
  the lock file removes the file, and the directory if the lock created it.
  ``check_workdir(path)`` refuses, in one line, a path that cannot be a
  workdir (an existing file).

Results files
  Every evaluation writes its own file, named by what produced it, so results
  of different protocols never overwrite each other::

    result_path(workdir, "final")                 -> final_eval.json
    result_path(workdir, "paper")                 -> eval_paper.json
    result_path(workdir, "strong", eot=10)        -> eval_strong_eot10.json
    result_path(workdir, "paper", checkpoint="latest", eot=None)
                                                  -> eval_paper_checkpointlatest.json
    result_path(workdir, "paper", n=50)           -> eval_paper_n50.json

  ``eval_result_path(workdir, config)`` names the file of the evaluation a
  run config's ``eval`` section describes; an evaluation of the first N test
  images only (``eval.num_examples=N``) says ``_n<N>``.

  ``final`` is train.py's short end-of-training evaluation; other protocols
  are eval.py's. Settings are appended in sorted key order as ``_<key><value>``;
  settings that are ``None`` or ``False`` are left out (pass ``None`` for a
  default), ``True`` appends ``_<key>``. Running the same protocol with the
  same settings again replaces its file with the new result.

  ``write_results(path, results, metadata)`` writes ``results`` plus a
  ``"metadata"`` entry (see ``results_metadata``: config, fkjax version, git
  commit, checkpoint step, data, UTC date) atomically: a temporary file in the
  same directory, ``fsync``, then ``os.replace``. A crash or a full disk
  leaves the previous file intact.

  An evaluation also keeps which test images each attack left correctly
  classified (``correct_per_image``: attack -> ``encode_correct(vector)``),
  so two nets evaluated on the same images can be compared image by image
  (``decode_correct``).
"""
from __future__ import annotations

import base64
import datetime
import errno
import fcntl
import json
import math
import os
import re
import socket
import subprocess
import sys
import warnings
from typing import Any, Mapping

import numpy as np

from fkjax import atomic

LOCK_NAME = "fkjax.lock"
FINAL = "final"  # the protocol name of train.py's final evaluation
# flock errnos that mean "not supported here" rather than "held by another".
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


class WorkdirError(RuntimeError):
  """The workdir is in use, is no directory, or a results file cannot be
  written."""


def check_workdir(workdir: str | os.PathLike[str]) -> None:
  """Raises :class:`WorkdirError` where ``workdir`` names an existing file,
  or lies below one, instead of a directory (existing or not)."""
  path = os.path.abspath(os.fspath(workdir))
  node = path
  while True:
    if os.path.exists(node) and not os.path.isdir(node):
      below = "" if node == path else f" (its parent {node} is a file)"
      raise WorkdirError(
          f"--workdir={os.fspath(workdir)} is not a directory{below}: pass "
          "the directory that holds (or will hold) the run")
    parent = os.path.dirname(node)
    if parent == node:
      return
    node = parent


# --------------------------------------------------------------------------
# Lock.


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds").replace("+00:00", "Z")


class WorkdirLock:
  """An advisory lock on a workdir, released when its process ends.

  Usage::

    with WorkdirLock(workdir):
      ...  # train

  Args:
    workdir: the directory to lock (created if missing).
    shared: take a shared lock (readers such as evaluations) instead of an
      exclusive one (training).
  """

  def __init__(self, workdir: str | os.PathLike[str], *, shared: bool = False):
    self.workdir = os.path.abspath(os.fspath(workdir))
    self.path = os.path.join(self.workdir, LOCK_NAME)
    self.shared = shared
    self._fd: int | None = None
    # The outermost directory this lock created (None: the workdir existed).
    self._made: str | None = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> "WorkdirLock":
    """Takes the lock without waiting.

    Raises:
      WorkdirError: another process holds it (naming that process).
    """
    if self._fd is not None:
      raise WorkdirError(f"the lock on {self.workdir} is already held")
    check_workdir(self.workdir)
    mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
    while True:
      if not os.path.isdir(self.workdir):
        self._made = _outermost_missing(self.workdir)
        os.makedirs(self.workdir, exist_ok=True)
      try:
        # O_CLOEXEC: child processes must not inherit (and keep) the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
      except FileNotFoundError:
        continue  # the directory was tidied away in between (see release)
      try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _describe_holder(fd)
        os.close(fd)
        raise WorkdirError(
            f"{self.workdir} is in use by {holder}; wait for it or stop it"
        ) from None
      except OSError as e:
        os.close(fd)
        if e.errno not in _NO_FLOCK:
          raise
        warnings.warn(f"cannot lock {self.path} ({e.strerror}): this "
                      "filesystem does not support flock; make sure no other "
                      "process uses the workdir", RuntimeWarning,
                      stacklevel=2)
        return self
      if _is_current(fd, self.path):
        break
      # Locked a file that a releasing holder had just removed: the lock
      # must be on the file that the path names now.
      os.close(fd)
    self._fd = fd
    _write_holder(fd)
    return self

  def release(self) -> None:
    """Releases the lock; an exclusive holder whose workdir holds nothing
    but the lock file removes it (and the directory, if it made it)."""
    if self._fd is not None:
      fd, self._fd = self._fd, None
      if not self.shared:
        self._tidy()
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)

  def _tidy(self) -> None:
    # Still holding the lock: a process that opened the file meanwhile finds
    # it gone after taking its lock (_is_current) and starts over.
    try:
      if os.listdir(self.workdir) != [LOCK_NAME]:
        return
      os.unlink(self.path)
      if self._made is not None:
        directory = self.workdir
        while True:
          os.rmdir(directory)   # fails, and stops, on anything not empty
          if directory == self._made:
            break
          directory = os.path.dirname(directory)
    except OSError:
      pass  # something appeared meanwhile, or no permission: keep it

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc_info: Any) -> None:
    self.release()


def _outermost_missing(path: str) -> str:
  """The outermost directory of ``path`` that does not exist yet."""
  while not os.path.exists(os.path.dirname(path)):
    path = os.path.dirname(path)
  return path


def _is_current(fd: int, path: str) -> bool:
  """Whether ``fd`` is still the file at ``path`` (not one unlinked)."""
  try:
    here, there = os.fstat(fd), os.stat(path)
  except OSError:
    return False
  return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _write_holder(fd: int) -> None:
  command = " ".join([os.path.basename(sys.argv[0] or "python"),
                      *sys.argv[1:]])
  info = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": _utc_now(), "command": command[:200]}
  data = (json.dumps(info) + "\n").encode()
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
  except OSError:
    pass  # the lock holds without the note; only the message is poorer


def _describe_holder(fd: int) -> str:
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    pid, host, since = int(info["pid"]), str(info["host"]), str(info["since"])
  except (OSError, ValueError, KeyError, TypeError):
    return "another process"
  if host == socket.gethostname() and not _alive(pid):
    # The note is from an earlier holder (a shared holder that has left);
    # whoever holds the lock now wrote none.
    return "another process"
  command = f" ({info['command']})" if info.get("command") else ""
  return f"process {pid}{command} on {host} since {since}"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


# --------------------------------------------------------------------------
# Results files.


_SAFE = re.compile(r"[^A-Za-z0-9.+-]")


def result_path(workdir: str | os.PathLike[str], protocol: str,
                **settings: Any) -> str:
  """The results file of ``protocol`` with ``settings`` (see module doc)."""
  if not protocol or _SAFE.search(protocol):
    raise ValueError(f"protocol must be a non-empty word of letters, digits, "
                     f"'.', '+' or '-', not {protocol!r}")
  parts = []
  for key in sorted(settings):
    value = settings[key]
    if value is None or value is False:
      continue
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
      raise ValueError(f"setting names must be alphanumeric, not {key!r}")
    parts.append(key if value is True else key + _SAFE.sub("-", str(value)))
  stem = "final_eval" if protocol == FINAL else f"eval_{protocol}"
  return os.path.join(os.fspath(workdir), "_".join([stem, *parts]) + ".json")


def eval_result_path(workdir: str | os.PathLike[str], config: Any,
                     final: bool = False) -> str:
  """The results file of the evaluation ``config.eval`` describes (its
  protocol, the strong protocol's targeting, EOT draws, a subset's size),
  or of train.py's end-of-training evaluation if ``final``."""
  if final:
    return result_path(workdir, FINAL)
  return _eval_result_path(workdir, config,
                           n=config.eval.get("num_examples") or None)


def _eval_result_path(workdir, config, n: int | None) -> str:
  # n: the first n test images only (eval.num_examples), in the name so
  # that a subset's result never replaces, nor passes for, the whole set's.
  if config.eval.protocol == "strong":
    # APGD-T is the default: a run without it says so.
    return result_path(workdir, "strong",
                       untargeted=not config.eval.strong.targeted, n=n)
  eot = config.eval.eot_samples
  return result_path(workdir, config.eval.protocol,
                     eot=eot if eot > 1 else None, n=n)


def adopt_subset_result(workdir: str | os.PathLike[str], config: Any) -> bool:
  """Renames the result of ``config``'s subset evaluation that fkjax wrote
  under the whole test set's name (before subsets said ``_n<N>``) to its
  name now; True if it did. Only a file whose recorded
  ``eval.num_examples`` is the config's moves, and never over a file."""
  n = config.eval.get("num_examples")
  new = eval_result_path(workdir, config)
  old = _eval_result_path(workdir, config, n=None)
  if not n or os.path.exists(new):
    return False
  try:
    with open(old) as f:
      recorded = json.load(f)["metadata"]["config"]["eval"]["num_examples"]
  except (OSError, ValueError, KeyError, TypeError):
    return False
  if recorded != n:
    return False
  os.replace(old, new)
  return True


def source_version(package_only: bool = False) -> dict[str, Any]:
  """fkjax's version and, when run from a git checkout, its commit.

  ``git_commit`` and ``git_dirty`` (uncommitted changes to tracked files;
  with ``package_only``, to those of the ``fkjax`` package alone) are None
  when the package is not inside a git work tree of its own.
  """
  import fkjax
  package = os.path.dirname(os.path.abspath(fkjax.__file__))
  out = {"fkjax_version": fkjax.__version__, "git_commit": None,
         "git_dirty": None}

  def git(*args: str) -> str | None:
    try:
      proc = subprocess.run(["git", "-C", package, *args], capture_output=True,
                            text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
      return None
    return proc.stdout.strip() if proc.returncode == 0 else None

  top = git("rev-parse", "--show-toplevel")
  # An installed package may sit inside some other repository (a venv in a
  # project): only a checkout that holds fkjax itself counts.
  if top is None or os.path.realpath(os.path.join(top, "fkjax")) != (
      os.path.realpath(package)):
    return out
  out["git_commit"] = git("rev-parse", "HEAD")
  status = git("status", "--porcelain", "--untracked-files=no",
               *(["--", package] if package_only else []))
  out["git_dirty"] = None if status is None else bool(status)
  return out


def results_metadata(config: Any, *, step: int | None,
                     data: str | None, checkpoint: str | None = None,
                     **extra: Any) -> dict[str, Any]:
  """What produced a result: for ``write_results``.

  Args:
    config: the run's config (an ``ml_collections.ConfigDict`` or a mapping),
      stored whole: model, sparsity and attack settings included.
    step: the checkpoint's training step.
    data: a description of the data evaluated (``Dataset.description``).
    checkpoint: which checkpoint (``"best"``/``"latest"``).
    **extra: anything else worth recording (e.g. ``protocol="paper"``).
  """
  if hasattr(config, "to_json_best_effort"):
    config_dict = json.loads(config.to_json_best_effort())
  else:
    config_dict = json.loads(json.dumps(dict(config), default=_jsonable))
  return {"date": _utc_now(), **source_version(), "checkpoint": checkpoint,
          "step": step, "data": data, **extra, "config": config_dict}


def _jsonable(value: Any) -> Any:
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
    return np.asarray(value).tolist()
  if isinstance(value, Mapping):
    return dict(value)
  if isinstance(value, (set, tuple)):
    return list(value)
  return str(value)


def _finite_or_none(value: Any) -> Any:
  """JSON has no NaN/inf: strict readers (jq, JavaScript) reject them."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite_or_none(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_finite_or_none(v) for v in value]
  return value


def write_results(path: str | os.PathLike[str], results: Mapping[str, Any],
                  metadata: Mapping[str, Any]) -> None:
  """Writes ``{**results, "metadata": metadata}`` to ``path`` atomically.

  Raises:
    ValueError: ``results`` has its own ``"metadata"`` entry.
    WorkdirError: the file cannot be written (e.g. the disk is full); the
      previous file, if any, is unchanged.
  """
  if "metadata" in results:
    raise ValueError("results must not have a 'metadata' entry")
  path = os.fspath(path)
  document = json.loads(json.dumps({**results, "metadata": dict(metadata)},
                                   default=_jsonable))
  text = json.dumps(_finite_or_none(document), indent=2) + "\n"
  try:
    atomic.write_text(path, text)
  except OSError as e:
    if e.errno in _NO_SPACE:
      raise WorkdirError(
          f"no space left on device while writing {path}; free space and "
          "rerun (the previous file is unchanged)") from e
    raise WorkdirError(f"could not write {path}: {e.strerror or e}") from e


# How ``correct_per_image`` vectors are written: one bit per test image, in
# test-set order, packed by ``numpy.packbits`` (first image in the highest
# bit of the first byte), then base64.
CORRECT_ENCODING = "base64 of numpy.packbits (bitorder big), one bit per image"


def encode_correct(correct: Any) -> str:
  """A boolean vector (one entry per test image) as a short ASCII string."""
  bits = np.packbits(np.asarray(correct, dtype=bool).reshape(-1))
  return base64.b64encode(bits.tobytes()).decode("ascii")


def decode_correct(text: str, num_images: int) -> np.ndarray:
  """The boolean vector of :func:`encode_correct` (``num_images`` long)."""
  bits = np.frombuffer(base64.b64decode(text), dtype=np.uint8)
  if bits.size != (num_images + 7) // 8:
    raise ValueError(f"{bits.size} bytes cannot hold {num_images} images")
  return np.unpackbits(bits, count=num_images).astype(bool)
