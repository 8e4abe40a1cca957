"""A finished run's result files kept under ``results/``, beside its table.

Workdirs hold checkpoints and are not committed, so a fresh checkout has
none. Without a copy of each finished run's own files a table could not be
rewritten there (its rows would read "not yet run") and the runner would
train them again. So every finished run's small files (its record, config,
metrics log, evaluations and weight analysis; never its checkpoints) are
copied to ``<results>/<scale>/runs/<table>/<row>_seed<k>/``, and a run whose
workdir is missing gets them back before anything reads it. A restored run
is ``done`` as before but has no checkpoint: a changed training setting
trains it again, and an evaluation added or changed since stays pending
until it is trained again (``--no-restore``).
"""
from __future__ import annotations

import glob
import os
import shutil
from typing import Iterable

from fkjax import atomic
from fkjax import pretrained
from reproduce import files

RUN_RECORD = pretrained.RUN_RECORD
PROGRESS_FILE = "reproduce_progress.json"
# Everything a finished run reports from, and nothing it can be rebuilt from.
KEPT = (RUN_RECORD, PROGRESS_FILE, "config.json", "metrics.jsonl",
        "final_eval.json", "eval_*.json", "analysis.json", "analysis.npz",
        # the evaluated weights, where the scale publishes them
        "weights.npz")


def archive_dir(results: str, scale: str, table: str, row: str,
                seed: int) -> str:
  """Where a run's files are kept: ``<results>/<scale>/runs/<table>/...``,
  where :mod:`fkjax.pretrained` finds them."""
  return pretrained.run_folder(results, scale, table, row, seed)


def _kept_files(directory: str) -> list[str]:
  out: list[str] = []
  for pattern in KEPT:
    out += sorted(glob.glob(os.path.join(directory, pattern)))
  return [p for p in out if os.path.isfile(p) and ".tmp" not in p]


def _copy(sources: Iterable[str], directory: str) -> None:
  for src in sources:
    with open(src, "rb") as f, atomic.replacing(
        os.path.join(directory, os.path.basename(src)), "wb") as out:
      shutil.copyfileobj(f, out)


def save(workdir: str, archive: str) -> None:
  """Copies a finished run's kept files from ``workdir`` to ``archive``.

  The record is copied last, so an archive whose record is there is whole.
  """
  sources = _kept_files(workdir)
  record = os.path.join(workdir, RUN_RECORD)
  _copy([s for s in sources if s != record], archive)
  _copy([record], archive)


def differs(workdir: str, archive: str) -> bool:
  """Whether one of ``workdir``'s kept files is missing from ``archive`` or
  differs there (a finished run evaluated again, say)."""
  for path in _kept_files(workdir):
    kept = os.path.join(archive, os.path.basename(path))
    if not os.path.isfile(kept):
      return True
    with open(path, "rb") as a, open(kept, "rb") as b:
      if a.read() != b.read():
        return True
  return False


def is_empty(workdir: str) -> bool:
  """Whether ``workdir`` is missing or holds nothing."""
  return not os.path.isdir(workdir) or not os.listdir(workdir)


def restore(workdir: str, archive: str) -> bool:
  """Gives an empty (or missing) ``workdir`` back the finished run kept in
  ``archive``; returns whether it did. The caller checks that the run's
  settings are still those it ran with."""
  if not is_empty(workdir) or not files.load_json(
      os.path.join(archive, RUN_RECORD), files.RUN_RECORD):
    return False
  _copy(_kept_files(archive), workdir)
  return True
