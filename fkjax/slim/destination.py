"""Where ``export.py`` writes: a new folder, or an earlier export of fkjax
replaced in fkjax's own files only.

``export.py --out=DIR`` on an existing folder used to delete ``DIR/variables/``
with whatever the user kept there (orbax saves with ``force=True``). Now the
export is written into a hidden folder of its own inside ``DIR``
(:func:`staging`: on the same file system, so that moving its files is a
rename even where ``DIR`` is a mount point), then :func:`install` moves its
files in: ``DIR`` is refused, in one line,
when it is a file, or a folder that holds files but no export of fkjax
(:func:`check`, before any work), or when its ``variables/`` holds anything
orbax does not write there. Anything else in ``DIR`` (the user's notes, other
exports' files) stays as it was.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile

from fkjax.slim.io import ARCHITECTURE
from fkjax.slim.io import VARIABLES
from fkjax.workdir.check import WorkdirError

COSTS = "costs.json"
# What an export writes into its folder; architecture.json last, since it is
# what makes a folder an export.
OWN_FILES = (VARIABLES, COSTS, ARCHITECTURE)
_FORMAT = "fkjax.slim/1"
# The hidden folders an export is written in before its files move out.
STAGING_PREFIX = ".fkjax-export-"


def is_export(path: str) -> bool:
  """Whether ``path`` is a folder that fkjax's export wrote (its
  ``architecture.json`` is fkjax.slim's)."""
  try:
    with open(os.path.join(path, ARCHITECTURE)) as f:
      return json.load(f).get("format") == _FORMAT
  except (OSError, ValueError, AttributeError):
    return False


def check(out: str) -> None:
  """Raises ``WorkdirError`` unless an export may be written to ``out``: a
  path that does not exist, an empty folder, or an earlier export."""
  if not os.path.exists(out):
    return
  if not os.path.isdir(out):
    raise WorkdirError(f"--out={out} is a file, not a folder: choose another "
                       "--out")
  if _contents(out) and not is_export(out):
    raise WorkdirError(
        f"--out={out} holds files but no export of fkjax (no fkjax "
        f"{ARCHITECTURE}): export.py writes {', '.join(OWN_FILES)} there and "
        "would replace them; choose a new or empty folder")


def _contents(out: str) -> list[str]:
  """What ``out`` holds besides exports being written."""
  return [n for n in os.listdir(out) if not n.startswith(STAGING_PREFIX)]


def staging(out: str) -> str:
  """A new hidden folder inside ``out`` (made if missing) to write the
  export into; an earlier export's left by a killed process is removed."""
  os.makedirs(out, exist_ok=True)
  for name in os.listdir(out):
    if name.startswith(STAGING_PREFIX) and not _alive(name):
      shutil.rmtree(os.path.join(out, name), ignore_errors=True)
  return tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=out)


def _alive(name: str) -> bool:
  """Whether the process that made the staging folder ``name`` runs."""
  try:
    pid = int(name[len(STAGING_PREFIX):].split("-", 1)[0])
    os.kill(pid, 0)
  except (ValueError, ProcessLookupError):
    return False
  except PermissionError:
    return True
  return True


def discard(staged: str) -> None:
  """Removes an export that failed in ``staged``, and its folder ``out``
  if that holds nothing else now (it was made for the export)."""
  shutil.rmtree(staged, ignore_errors=True)
  try:
    os.rmdir(os.path.dirname(staged))
  except OSError:
    pass   # it holds something: the user's, or an earlier export


def _foreign(old: str, new: str) -> list[str]:
  """What the old ``variables/`` holds that an orbax save does not write
  (by the names at its top, which the new save shows)."""
  if not os.path.isdir(old):
    return []
  ours = set(os.listdir(new))
  return sorted(name for name in os.listdir(old) if name not in ours)


def install(staged: str, out: str) -> str:
  """Moves the export written in ``staged`` (:func:`staging`) to ``out``,
  replacing only an earlier export's own files; removes ``staged``.
  Returns ``out``'s absolute path.

  Raises:
    WorkdirError: ``out`` cannot take an export (:func:`check`), or its
      ``variables/`` holds files orbax did not write (named); nothing in
      ``out`` has changed then.
  """
  out = os.path.abspath(out)
  try:
    check(out)
    foreign = _foreign(os.path.join(out, VARIABLES),
                       os.path.join(staged, VARIABLES))
    if foreign:
      more = ", ..." if len(foreign) > 3 else ""
      raise WorkdirError(
          f"{os.path.join(out, VARIABLES)} holds files export.py did not "
          f"write ({', '.join(foreign[:3])}{more}); it would replace that "
          "folder: move them, or choose another --out")
    os.makedirs(out, exist_ok=True)
    old = os.path.join(staged, "replaced")
    os.mkdir(old)
    for name in OWN_FILES:
      target = os.path.join(out, name)
      if os.path.lexists(target):
        os.rename(target, os.path.join(old, name))
      os.rename(os.path.join(staged, name), target)
  finally:
    shutil.rmtree(staged, ignore_errors=True)
  return out


def write_error(out: str, cause: OSError) -> WorkdirError:
  """The one line for an export to ``out`` that ``cause`` failed (``out``
  is unchanged: the export is written in a hidden folder first)."""
  if cause.errno in (errno.ENOSPC, errno.EDQUOT):
    return WorkdirError(f"no space left on device while writing the export "
                        f"to {out}; free space and rerun ({out} is "
                        "unchanged)")
  text = cause.strerror or os.strerror(cause.errno or 0)
  return WorkdirError(f"could not write the export to {out}: {text}; fix "
                      f"this and rerun ({out} is unchanged)")
