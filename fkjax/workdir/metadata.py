"""What produced a result: fkjax's version, its git commit, the config."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from typing import Any, Mapping

import numpy as np


def utc_now() -> str:
  """The time now, to the second, as ISO 8601 in UTC (``...Z``)."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds").replace("+00:00", "Z")


def source_version(package_only: bool = False) -> dict[str, Any]:
  """fkjax's version and, when run from a git checkout, its commit.

  ``git_commit`` and ``git_dirty`` (uncommitted changes to tracked files;
  with ``package_only``, to those of the ``fkjax`` package alone) are None
  when the package is not inside a git work tree of its own.
  """
  import fkjax
  package = os.path.dirname(os.path.abspath(fkjax.__file__))
  out = {"fkjax_version": fkjax.__version__, "git_commit": None,
         "git_dirty": None}

  def git(*args: str) -> str | None:
    try:
      proc = subprocess.run(["git", "-C", package, *args], capture_output=True,
                            text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
      return None
    return proc.stdout.strip() if proc.returncode == 0 else None

  top = git("rev-parse", "--show-toplevel")
  # An installed package may sit inside some other repository (a venv in a
  # project): only a checkout that holds fkjax itself counts.
  if top is None or os.path.realpath(os.path.join(top, "fkjax")) != (
      os.path.realpath(package)):
    return out
  out["git_commit"] = git("rev-parse", "HEAD")
  status = git("status", "--porcelain", "--untracked-files=no",
               *(["--", package] if package_only else []))
  out["git_dirty"] = None if status is None else bool(status)
  return out


def results_metadata(config: Any, *, step: int | None,
                     data: str | None, checkpoint: str | None = None,
                     **extra: Any) -> dict[str, Any]:
  """What produced a result: for ``write_results``.

  Args:
    config: the run's config (an ``ml_collections.ConfigDict`` or a mapping),
      stored whole: model, sparsity and attack settings included.
    step: the checkpoint's training step.
    data: a description of the data evaluated (``Dataset.description``).
    checkpoint: which checkpoint (``"best"``/``"latest"``).
    **extra: anything else worth recording (e.g. ``protocol="paper"``).
  """
  if hasattr(config, "to_json_best_effort"):
    config_dict = json.loads(config.to_json_best_effort())
  else:
    config_dict = json.loads(json.dumps(dict(config), default=jsonable))
  return {"date": utc_now(), **source_version(), "checkpoint": checkpoint,
          "step": step, "data": data, **extra, "config": config_dict}


def jsonable(value: Any) -> Any:
  """``value`` as JSON data (NumPy scalars and arrays as numbers and lists,
  anything else unknown as its text)."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
    return np.asarray(value).tolist()
  if isinstance(value, Mapping):
    return dict(value)
  if isinstance(value, (set, tuple)):
    return list(value)
  return str(value)
