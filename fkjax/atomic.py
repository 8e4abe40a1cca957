"""Files written whole or not at all: a kill or a full disk leaves the old one.

Every file fkjax writes for users to keep (configs, results, sweep records,
archives) goes through :func:`replacing`: the bytes go to a temporary file in
the same directory, are flushed to disk, and only then take the target's name
with ``os.replace`` (atomic on POSIX); the directory is flushed so that the
rename itself survives a power cut.

The temporary file is named ``.<name>.<host>.<pid>.<random>.tmp``: a writer
killed mid-write (SIGKILL, a power cut) leaves it behind, and the next
writer of the same file removes it (:func:`remove_stale`) where its process
is gone (on this host), or where it is older than :data:`STALE_SECONDS`
(another host's, or one named before names said their process); never one
of a live writer beside it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
import time
from typing import IO, Any, Iterator

__all__ = ["remove_stale", "replacing", "write_bytes", "write_json",
           "write_text"]

# A staging file this old is no live writer's, whoever named it (a write
# takes seconds).
STALE_SECONDS = 6 * 3600


def _host() -> str:
  return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:
    return True   # another user's process: alive
  return True


def remove_stale(path: str | os.PathLike[str]) -> list[str]:
  """Removes the staging files that killed writers of ``path`` left (see
  the module docstring); returns their paths."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  base = re.escape(os.path.basename(path))
  ours = re.compile(rf"\.{base}\.([A-Za-z0-9-]+)\.(\d+)\.\w+\.tmp")
  # mkstemp's 8 characters, before names said their process
  older = re.compile(rf"\.{base}\.[a-z0-9_]{{8}}\.tmp")
  host, now, removed = _host(), time.time(), []
  try:
    names = os.listdir(directory)
  except OSError:
    return removed
  for name in names:
    match = ours.fullmatch(name)
    if match is None and older.fullmatch(name) is None:
      continue
    full = os.path.join(directory, name)
    try:
      if match is not None and match.group(1) == host:
        stale = not _alive(int(match.group(2)))
      else:
        stale = now - os.lstat(full).st_mtime > STALE_SECONDS
      if stale:
        os.remove(full)
        removed.append(full)
    except OSError:
      continue   # gone already, or not ours to remove
  return removed


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], mode: str = "w"
              ) -> Iterator[IO[Any]]:
  """Opens a temporary file that replaces ``path`` when the block succeeds.

  Args:
    path: the file to write; its directory is created if missing.
    mode: ``"w"`` (text) or ``"wb"`` (bytes).

  Yields:
    The open temporary file. If the block raises, it is removed and ``path``
    is left as it was.
  """
  if mode not in ("w", "wb"):
    raise ValueError(f"mode must be 'w' or 'wb', not {mode!r}")
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  remove_stale(path)
  fd, tmp = tempfile.mkstemp(
      dir=directory,
      prefix=f".{os.path.basename(path)}.{_host()}.{os.getpid()}.",
      suffix=".tmp")
  try:
    with os.fdopen(fd, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
  _fsync_directory(directory)


def write_text(path: str | os.PathLike[str], text: str) -> None:
  """Writes ``text`` to ``path`` atomically."""
  with replacing(path) as f:
    f.write(text)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
  """Writes ``data`` to ``path`` atomically."""
  with replacing(path, "wb") as f:
    f.write(data)


def write_json(path: str | os.PathLike[str], data: Any, *,
               sort_keys: bool = False) -> None:
  """Writes ``data`` as indented JSON (and a final newline) atomically."""
  write_text(path, json.dumps(data, indent=2, sort_keys=sort_keys) + "\n")


def _fsync_directory(directory: str) -> None:
  # Not every filesystem lets a directory be opened or synced (some network
  # and Windows ones); the file itself is already whole then.
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)
