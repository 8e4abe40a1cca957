"""What went wrong with a checkpoint, said in one line.

``CheckpointError`` is the one exception type a user sees (the command line
prints it as ``error: ...``). Orbax and tensorstore report a failed write in
many types and pages of text; :func:`os_error` finds the system error behind
them, so that :func:`write_error` can say it in one line.
"""
from __future__ import annotations

import errno
import os
import re

# errnos that mean "the disk cannot take more": the user must free space.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# Tensorstore's way of naming the errno in its error text.
_TS_ERRNO = re.compile(r"os_error_code='?(\d+)")
# Tensorstore's dump of its internals, after the message proper.
_TS_DETAILS = " See full TensorStore details"


class CheckpointError(RuntimeError):
  """A checkpoint is missing, corrupt, unwritable, or does not match."""


def os_error(e: BaseException | None) -> OSError | None:
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


def write_error(step: int, target: str, cause: OSError) -> CheckpointError:
  """The one line for a save of ``step`` to ``target`` that ``cause`` failed;
  it says what to do (the previous checkpoints are intact)."""
  resume = ("rerun the same command to resume (the previous checkpoints are "
            "intact)")
  if cause.errno in _NO_SPACE:
    return CheckpointError(
        f"no space left on device while saving checkpoint step {step} to "
        f"{target}; free space and {resume}")
  text = cause.strerror or os.strerror(cause.errno or 0)
  if cause.filename:
    text = f"{text} ({cause.filename})"
  return CheckpointError(
      f"could not write checkpoint step {step} to {target}: {text}; fix this "
      f"and {resume}")


def restore_error(which: str, step: int, where: str,
                  e: BaseException) -> CheckpointError:
  """The one line for a restore that orbax failed with ``e``: its first
  line, without tensorstore's internals, and what to do."""
  first = (str(e).strip().splitlines() or [""])[0].split(_TS_DETAILS)[0]
  return CheckpointError(
      f"could not restore the {which} checkpoint at step {step} from "
      f"{where}: {type(e).__name__}: {first} Is it complete, and was it "
      "written with the same model/optimizer config? If it is damaged, "
      f"delete {where} to use the previous checkpoint")
