"""Sweeps (``--sweep``): runs that differ only in seeds or hyperparameters
train as one program (:mod:`fkjax.training.sweep`), then each goes through
its other stages (:func:`reproduce.run.execute.execute`)."""
from __future__ import annotations

import os
from typing import Iterable

from fkjax.training import devices
from fkjax.training import sweep as sweep_lib
from reproduce.run import execute as execute_lib
from reproduce.run import progress as progress_lib
from reproduce.run import runs as runs_lib
from reproduce.run import standing as standing_lib
from reproduce.run.runs import Run


def _train_pending(run: Run) -> bool:
  progress = progress_lib.Progress(run.workdir)
  done = progress.done("train", standing_lib.fingerprints(run)["train"])
  return not (done and standing_lib.train_done(run))


def sweep_groups(runs: Iterable[Run], max_runs: int | None = None
                 ) -> list[list[Run]]:
  """The runs whose training is not done, grouped into sweeps: runs that
  differ only in :data:`fkjax.training.sweep.SWEEPABLE_KEYS` (a row's seeds;
  rows differing in lambda1, beta, ...), at most ``max_runs`` a group. A
  group of one trains alone."""
  seen, pending = set(), []
  for run in runs:
    if run.workdir not in seen and _train_pending(run):
      pending.append(run)
    seen.add(run.workdir)
  return [[pending[i] for i in members] for members in
          sweep_lib.groups([r.config for r in pending], max_runs)]


def train_in_sweeps(runs: Iterable[Run], *, max_runs: int | None = None,
                    show_progress: bool = True) -> list[str]:
  """Trains the runs of every group of :func:`sweep_groups` with two or more
  runs as one ``fkjax.training.sweep.train_sweep`` program; returns their
  keys.

  Each run's workdir ends up as its own training leaves it (``data_order=
  "per_run"``: every run sees its own seed's batches, so its config and
  numbers are the single run's, to float rounding) and its train stage is
  marked done, with its share of the sweep's wall time;
  :func:`reproduce.run.execute.execute` then runs its other stages. A group
  that fails leaves its runs to train one at a time.
  """
  trained = []
  for group in sweep_groups(runs, max_runs):
    if len(group) < 2:
      continue
    keys = [r.key for r in group]
    progress_lib.log(f"sweep of {len(group)} runs as one program: "
                     f"{', '.join(keys)}")
    configs = [runs_lib.with_overrides(r.config, {"progress": show_progress})
               for r in group]
    try:
      for run in group:
        execute_lib.check_workdir(run)
        os.makedirs(run.workdir, exist_ok=True)
      devices.enable_compilation_cache(configs[0])
      progresses = [progress_lib.Progress(r.workdir) for r in group]
      for p in progresses:
        p.data.pop("error", None)
      progress_lib.timed_together(
          progresses, "train",
          [standing_lib.fingerprints(r)["train"] for r in group],
          lambda: sweep_lib.train_sweep(
              configs, [r.workdir for r in group], names=keys,
              data_order="per_run"))
    except Exception as e:  # pylint: disable=broad-except
      progress_lib.log(f"the sweep of {', '.join(keys)} failed "
                       f"({type(e).__name__}: {e}); its runs train one at "
                       "a time")
      continue
    trained += keys
  return trained
