"""Reading the result files back (they are written with :mod:`fkjax.atomic`:
a kill at any moment leaves a whole file; one that is not whole, or not of
its shape, was damaged or replaced outside fkjax and stops the tool in one
line naming it: :mod:`fkjax.readback`)."""
from __future__ import annotations

from typing import Any

from fkjax import readback
from fkjax.readback import NUMBER, ListOf, MapOf

# What each file the tool reads back must hold (the keys its readers use).
RUN_RECORD = {"done": bool, "fingerprints?": MapOf(str),
              "metrics?": MapOf(NUMBER), "commands?": MapOf(str),
              "stage_seconds?": MapOf(NUMBER)}
PROGRESS = {"stages": MapOf({"seconds": NUMBER, "attempts": int,
                             "done": bool, "fingerprint?": str}),
            "error?": str}
TABLE = {"rows": ListOf({"name": str, "summary?": MapOf(dict),
                         "runs?": ListOf(dict), "paper?": dict}),
         "paper_ref?": str, "metrics?": dict}
ANALYSIS = {"w": {"small_share": NUMBER, "zero_share": NUMBER,
                  "channel_sparsity": NUMBER, "small_channel_share": NUMBER}}


def load_json(path: str, shape: Any = dict, what: str = "") -> Any | None:
  """The JSON in ``path`` checked against ``shape``, or None if it is
  missing; :class:`fkjax.readback.DamagedFileError` if it is damaged."""
  return readback.read_json(path, shape, what=what)
