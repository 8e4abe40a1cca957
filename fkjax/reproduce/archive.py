"""A finished run's result files kept under ``results/``, beside its table.

Workdirs hold checkpoints and are not committed, so a fresh checkout has
none. Without a copy of each finished run's own files a table could not be
rewritten there (its rows would read "not yet run") and the runner would
train them again. So every finished run's small files (its record, config,
metrics log, evaluations and weight analysis; never its checkpoints) are
copied to ``<results>/<scale>/runs/<table>/<row>_seed<k>/``, and a run whose
workdir is missing gets them back before anything reads it. A restored run
is ``done`` as before but has no checkpoint: a changed training or main
evaluation setting trains it again, and an extra evaluation added since
stays pending until it is trained again (``--no-restore``).

Tables written before this archive existed hold each finished run's record
in ``<results>/<scale>/<table>.json``: such a run is restored from that
record (its metrics, wall time and commands; not its figures' data) when its
settings are still those it was run with.
"""
from __future__ import annotations

import copy
import glob
import itertools
import os
import shutil
from typing import Any, Callable, Iterable, Iterator

from fkjax import run_config
from fkjax.reproduce import files

RUN_RECORD = "reproduce_run.json"
PROGRESS_FILE = "reproduce_progress.json"
# Everything a finished run reports from, and nothing it can be rebuilt from.
KEPT = (RUN_RECORD, PROGRESS_FILE, "config.json", "metrics.jsonl",
        "final_eval.json", "eval_*.json", "analysis.json", "analysis.npz")


def archive_dir(results: str, scale: str, table: str, row: str,
                seed: int) -> str:
  """Where a run's files are kept: ``<results>/<scale>/runs/<table>/...``."""
  return os.path.join(results, scale, "runs", table, f"{row}_seed{seed}")


def _kept_files(directory: str) -> list[str]:
  out: list[str] = []
  for pattern in KEPT:
    out += sorted(glob.glob(os.path.join(directory, pattern)))
  return [p for p in out if os.path.isfile(p) and ".tmp" not in p]


def _copy(sources: Iterable[str], directory: str) -> None:
  os.makedirs(directory, exist_ok=True)
  for src in sources:
    dst = os.path.join(directory, os.path.basename(src))
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def save(workdir: str, archive: str) -> None:
  """Copies a finished run's kept files from ``workdir`` to ``archive``.

  The record is copied last, so an archive whose record is there is whole.
  """
  sources = _kept_files(workdir)
  record = os.path.join(workdir, RUN_RECORD)
  _copy([s for s in sources if s != record], archive)
  _copy([record], archive)


def _is_empty(workdir: str) -> bool:
  return not os.path.isdir(workdir) or not os.listdir(workdir)


def _legacy_entry(tables_dir: str, table: str, row: str, seed: int
                  ) -> tuple[str, dict[str, Any]] | None:
  # A shared row is recorded in every table that reports it, and a table
  # may have been written without its owner's.
  for path in sorted(glob.glob(os.path.join(tables_dir, "*.json"))):
    data = files.load_json(path)
    rows = data.get("rows", []) if isinstance(data, dict) else []
    for r in rows:
      for entry in r.get("runs", []):
        if (entry.get("status") == "done" and entry.get("table") == table
            and entry.get("row") == row and entry.get("seed") == seed):
          return path, entry
  return None


def _saved_configs(full: dict[str, Any]) -> Iterator[dict[str, Any]]:
  """``full``, then ``full`` without each set of its unset keys: a run
  trained before a placeholder key existed saved a config without it."""
  unset = [k for k, v in run_config.flatten(full).items() if v is None]
  for n in range(len(unset) + 1):
    for dropped in itertools.combinations(unset, n):
      config = copy.deepcopy(full)
      for key in dropped:
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
          node = node[p]
        del node[leaf]
      yield config


def restore(workdir: str, archive: str, *, tables_dir: str, table: str,
            row: str, seed: int, config: Any,
            fingerprints: Callable[[], Any]) -> str | None:
  """Gives an empty (or missing) ``workdir`` back its finished run.

  From ``archive`` when it holds a whole run; else from the run's record in
  a table of ``tables_dir`` (written before archives existed), when its
  fingerprints are those the run has now (``fingerprints()`` computes them
  from the ``config.json`` restored into ``workdir``). Returns where the run came from,
  or None when nothing was restored.
  """
  if not _is_empty(workdir):
    return None
  if files.load_json(os.path.join(archive, RUN_RECORD)):
    _copy(_kept_files(archive), workdir)
    return archive
  found = _legacy_entry(tables_dir, table, row, seed)
  if found is None:
    return None
  table_json, entry = found
  full = run_config.as_dict(config)
  # The saved config decides which unset placeholders count (runner's
  # fingerprints); a run trained before a placeholder existed saved none.
  for saved in _saved_configs(full):
    os.makedirs(workdir, exist_ok=True)
    files.atomic_json(run_config.config_path(workdir), saved)
    if fingerprints() == entry.get("fingerprints"):
      break
  else:
    shutil.rmtree(workdir)
    return None
  record = {k: v for k, v in entry.items() if k != "status"}
  stages = {name: {"seconds": seconds,
                   "attempts": entry.get("stage_attempts", {}).get(name, 1),
                   "done": True,
                   "fingerprint": entry["fingerprints"].get(
                       "eval" if name == "analysis" else name)}
            for name, seconds in entry.get("stage_seconds", {}).items()}
  files.atomic_json(os.path.join(workdir, PROGRESS_FILE), {"stages": stages})
  files.atomic_json(os.path.join(workdir, RUN_RECORD), record)
  return table_json
