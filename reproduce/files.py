"""Reading the result files back (they are written with :mod:`fkjax.atomic`:
a kill at any moment leaves a whole file)."""
from __future__ import annotations

import json
from typing import Any


def load_json(path: str) -> Any | None:
  """The JSON in ``path``, or None if it is missing or not whole."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
