"""A system error on a user's path, said in one line with the flag behind it.

Each entry point names the paths its flags gave (:func:`declare`): the
folders it will write are probed then (:func:`check_writable`), before any
work that a refusal later would throw away; and whatever ``OSError`` ends the
command later is said by :func:`describe` as ``--flag=PATH: <what is wrong>
(<the file concerned>)``, with what to do. The words are chosen by errno,
the same for every path and every flag.
"""
from __future__ import annotations

import errno
import os
import tempfile

__all__ = ["PathError", "check_writable", "declare", "declared",
           "describe", "is_path_error", "os_error", "words"]

# errno -> (what is wrong, what to do): the classes a user meets on a path.
_WORDS: dict[int, tuple[str, str]] = {
    errno.EACCES: ("permission denied", "choose a path you may write, or "
                   "change its permissions"),
    errno.EPERM: ("operation not permitted", "choose another path, or change "
                  "its permissions"),
    errno.EROFS: ("read-only file system", "choose a path on a writable file "
                  "system"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder",
                    "choose another path"),
    errno.EISDIR: ("is a folder, where a file was expected",
                   "choose another path"),
    errno.ENOSPC: ("no space left on device", "free some space and rerun the "
                   "same command to resume"),
    errno.EDQUOT: ("disk quota exceeded", "free some space and rerun the "
                   "same command to resume"),
    errno.EFBIG: ("file too large for this file system (or the process's "
                  "file size limit)", "choose a path on another file system"),
    errno.EXDEV: ("cannot move a file across file systems",
                  "choose a path on one file system"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.ENAMETOOLONG: ("file name too long", "choose a shorter path"),
    errno.ELOOP: ("too many symbolic links", "check the path"),
    errno.EEXIST: ("already exists", "choose another path"),
    errno.ENOTEMPTY: ("folder not empty", "choose another path"),
    errno.EBUSY: ("device or resource busy", "choose another path"),
    errno.EIO: ("input/output error", "check the disk"),
}

_declared: dict[str, str] = {}   # flag -> the path it gave


class PathError(RuntimeError):
  """A path given by a flag cannot be used (said in one line)."""


def declare(flag: str, path: str | os.PathLike[str] | None, *,
            write: bool = False, folders: tuple[str, ...] = (),
            file: bool = False) -> None:
  """Records that ``flag`` (e.g. ``"--workdir"``) gave ``path``, so that
  an error on it, or below it, names the flag; with ``write``, checks at
  once that the folder (``file``: the file's folder) can be written
  (:func:`check_writable`).

  Raises:
    PathError: ``write`` and the folder cannot be written.
  """
  if path is None:
    return
  path = os.fspath(path)
  if write:
    check_writable(flag, path, folders=folders, file=file)
  _declared[flag] = path


def declared() -> dict[str, str]:
  """The flags and paths :func:`declare` recorded, in this process."""
  return dict(_declared)


def check_writable(flag: str, path: str, *, folders: tuple[str, ...] = (),
                   file: bool = False) -> None:
  """Raises :class:`PathError` unless ``path`` is, or can be made, a folder
  that this process can write files in: not empty, no file on the way, and
  a file can be created (and is removed) in the deepest folder of ``path``
  that exists. Nothing is left behind. ``folders``: names inside ``path``
  that must be folders where they exist (e.g. ``checkpoints``); ``file``:
  ``path`` is a file to be written, whose folder is checked.
  """
  if not path:
    raise PathError(f"{flag} is empty: give a {'file' if file else 'folder'}")
  absolute = os.path.abspath(path)
  if file:
    if os.path.isdir(absolute):
      raise PathError(f"{flag}={path} is a folder, not a file: give a file "
                      "name")
    absolute = os.path.dirname(absolute)
  node = absolute
  while not os.path.isdir(node):
    if os.path.lexists(node):
      what = ("is" if node == os.path.abspath(path)
              else f"lies below {node}, which is")
      raise PathError(f"{flag}={path} {what} a file, not a folder: choose "
                      "another path")
    node = os.path.dirname(node)
  for name in folders:
    inner = os.path.join(absolute, name)
    if os.path.lexists(inner) and not os.path.isdir(inner):
      raise PathError(f"{flag}={path}: {inner} is a file, where a folder is "
                      "written; move it away or choose another path")
  try:
    fd, probe = tempfile.mkstemp(dir=node, prefix=".fkjax-write-check-")
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    wrong, todo = words(e)
    raise PathError(f"{flag}={path}: {wrong} (cannot create files in "
                    f"{node}); {todo}") from e


def os_error(e: BaseException | None) -> OSError | None:
  """The ``OSError`` behind ``e`` (itself, or its cause/context chain)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno is not None:
      return e
    e = e.__cause__ or e.__context__
  return None


def is_path_error(e: BaseException) -> bool:
  """Whether ``e`` is an ``OSError`` :func:`describe` says in one line: one
  of a class a user meets on a path (:data:`_WORDS`), or any that names a
  file."""
  return (isinstance(e, OSError) and e.errno is not None
          and (e.errno in _WORDS or bool(e.filename)))


def _flag_of(filename: str, flags: dict[str, str]) -> tuple[str, str] | None:
  """The flag whose path is ``filename`` or holds it (the deepest)."""
  target = os.path.abspath(filename)
  best = None
  for flag, path in flags.items():
    if not path:
      continue
    base = os.path.abspath(path)
    if target == base or target.startswith(base.rstrip(os.sep) + os.sep):
      if best is None or len(base) > len(os.path.abspath(best[1])):
        best = (flag, path)
  return best


def words(e: OSError) -> tuple[str, str]:
  """What is wrong, and what to do, for ``e``'s errno."""
  return _WORDS.get(e.errno or 0, (
      (e.strerror or os.strerror(e.errno or 0)).lower(), "fix it and rerun"))


def describe(e: OSError, flags: dict[str, str] | None = None) -> str:
  """One line for ``e``: the flag and path it concerns (from ``flags``,
  default those :func:`declare`\\ d), what is wrong, the file, what to do."""
  flags = _declared if flags is None else flags
  wrong, todo = words(e)
  files = [os.fspath(f) for f in (e.filename, e.filename2) if f]
  owner = None
  for name in files:
    owner = _flag_of(name, flags)
    if owner:
      break
  if owner is not None:
    flag, path = owner
    where = f"{flag}={path}"
    detail = [f for f in files
              if os.path.abspath(f) != os.path.abspath(path)]
    more = f" ({' -> '.join(detail)})" if detail else ""
    return f"{where}: {wrong}{more}; {todo}"
  if files:
    return f"{' -> '.join(files)}: {wrong}; {todo}"
  return f"{wrong}; {todo}"
