"""Files written whole or not at all: a kill or a full disk leaves the old one.

Every file fkjax writes for users to keep (configs, results, sweep records,
archives) goes through :func:`replacing`: the bytes go to a temporary file in
the same directory, are flushed to disk, and only then take the target's name
with ``os.replace`` (atomic on POSIX); the directory is flushed so that the
rename itself survives a power cut.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any, Iterator

__all__ = ["replacing", "write_bytes", "write_json", "write_text"]


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
  fd, tmp = tempfile.mkstemp(dir=directory,
                             prefix=f".{os.path.basename(path)}.",
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
