"""Result files written so that a kill at any moment leaves a whole file."""
from __future__ import annotations

import json
import os
from typing import Any


def atomic_json(path: str, data: Any) -> None:
  """Writes JSON to ``path``: after a kill, the old file or the new one."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def atomic_text(path: str, text: str) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def load_json(path: str) -> Any | None:
  """The JSON in ``path``, or None if it is missing or not whole."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
