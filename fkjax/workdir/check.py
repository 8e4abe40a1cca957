"""What a workdir must be: a directory (existing or not), never a file."""
from __future__ import annotations

import os


class WorkdirError(RuntimeError):
  """The workdir is in use, is no directory, or a results file cannot be
  written."""


def check_workdir(workdir: str | os.PathLike[str]) -> None:
  """Raises :class:`WorkdirError` where ``workdir`` names an existing file,
  or lies below one, instead of a directory (existing or not), or is empty
  (which would name the current directory)."""
  if not os.fspath(workdir):
    raise WorkdirError("--workdir is empty: give the directory that holds "
                       "(or will hold) the run")
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
