"""The lock on a workdir: one training process at a time.

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
An evaluation leaves no lock file behind either: the last shared holder
out removes the file when shared holders made it (not train.py, whose run
keeps it) and nobody else holds it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import warnings
from typing import Any

from fkjax.workdir.check import WorkdirError
from fkjax.workdir.check import check_workdir
from fkjax.workdir.metadata import utc_now

LOCK_NAME = "fkjax.lock"
# flock errnos that mean "not supported here" rather than "held by another".
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


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
    # Whether shared holders made the lock file (this one, or one before it
    # that left while another still held it): the last one out removes it.
    self._reader_made = False

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
        fd, made = _open(self.path)
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
    self._reader_made = self.shared and (made or _note(fd).get("reader_made")
                                         is True)
    _write_holder(fd, reader_made=self._reader_made)
    return self

  def release(self) -> None:
    """Releases the lock; an exclusive holder whose workdir holds nothing
    but the lock file removes it (and the directory, if it made it)."""
    if self._fd is not None:
      fd, self._fd = self._fd, None
      if not self.shared:
        self._tidy()
      elif self._reader_made:
        self._remove_if_alone(fd)
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)

  def _remove_if_alone(self, fd: int) -> None:
    """Removes the lock file if no other process holds it: the exclusive
    lock is free only then. (A process that opened the file meanwhile finds
    it gone once it has its lock, and starts over: see acquire.)"""
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return   # another holder: the last one out removes it
    try:
      if _is_current(fd, self.path):
        os.unlink(self.path)
    except OSError:
      pass  # no permission: keep it

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


def _open(path: str) -> tuple[int, bool]:
  """``(fd, made)``: the lock file opened, and whether this call made it."""
  # O_CLOEXEC: child processes must not inherit (and keep) the lock.
  flags = os.O_RDWR | os.O_CLOEXEC
  try:
    return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
  except FileExistsError:
    pass
  try:
    return os.open(path, flags), False
  except FileNotFoundError:
    # Removed in between by its last holder: make it.
    return os.open(path, flags | os.O_CREAT, 0o644), True


def _note(fd: int) -> dict[str, Any]:
  """What the lock file says of its holder (empty if nothing readable)."""
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
  except (OSError, ValueError):
    return {}
  return info if isinstance(info, dict) else {}


def _write_holder(fd: int, reader_made: bool = False) -> None:
  command = " ".join([os.path.basename(sys.argv[0] or "python"),
                      *sys.argv[1:]])
  info = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": utc_now(), "command": command[:200],
          "reader_made": reader_made}
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
