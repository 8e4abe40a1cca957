"""Where ``export.py`` writes: a new folder, or an earlier export of fkjax
replaced in fkjax's own files only.

``export.py --out=DIR`` on an existing folder used to delete ``DIR/variables/``
with whatever the user kept there (orbax saves with ``force=True``). Now the
export is written into a folder of its own beside ``DIR`` (:func:`staging`),
then :func:`install` moves its files in: ``DIR`` is refused, in one line,
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
  if os.listdir(out) and not is_export(out):
    raise WorkdirError(
        f"--out={out} holds files but no export of fkjax (no fkjax "
        f"{ARCHITECTURE}): export.py writes {', '.join(OWN_FILES)} there and "
        "would replace them; choose a new or empty folder")


def staging(out: str) -> str:
  """A new folder beside ``out`` to write the export into."""
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  return tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.export-",
                          dir=parent)


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
  is unchanged: the export is written beside it first)."""
  if cause.errno in (errno.ENOSPC, errno.EDQUOT):
    return WorkdirError(f"no space left on device while writing the export "
                        f"to {out}; free space and rerun ({out} is "
                        "unchanged)")
  text = cause.strerror or os.strerror(cause.errno or 0)
  return WorkdirError(f"could not write the export to {out}: {text}; fix "
                      f"this and rerun ({out} is unchanged)")
