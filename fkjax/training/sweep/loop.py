"""``train_sweep``: N runs trained at once, through the single run's own
loop (:func:`fkjax.training.train.train_runs`) on a run axis.

Every run keeps its own workdir, written as ``train.py`` writes a single
run's (``config.json``, ``checkpoints/``, ``metrics.jsonl``,
``tensorboard/``, ``final_eval.json``), so ``eval.py --workdir=<run>`` and
every other tool read it as one. The runs step together: one jitted program
per step for all of them.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import ml_collections

from fkjax import atomic
from fkjax import workdir as workdir_lib
from fkjax.training import train
from fkjax.training.sweep import spec
from fkjax.training.sweep import summary

ConfigError = spec.ConfigError
SWEEP_FILE = "sweep.json"


def train_sweep(configs: Sequence[ml_collections.ConfigDict],
                workdirs: Sequence[str | os.PathLike[str]], *,
                names: Sequence[str] | None = None,
                shard: str | None = None,
                data_order: str | None = None) -> list[dict[str, Any]]:
  """Trains (or resumes) the runs ``configs`` in ``workdirs`` as one program.

  Each workdir ends up as ``train.train_and_evaluate(config, workdir)``
  leaves it, and each run reaches the parameters of that single run (to
  float rounding; ``docs/sweeps.md``).

  Args:
    configs: the runs' configs, equal except for
      :data:`fkjax.training.sweep.SWEEPABLE_KEYS` (a ``sweep`` section is ignored).
    workdirs: one directory per run.
    names: the runs' names in messages; default the workdirs' base names.
    shard: ``"batch"`` (default: every batch split over the devices, the
      runs replicated) or ``"runs"`` (the runs split over the devices);
      default ``configs[0].sweep.shard`` if set.
    data_order: ``"shared"`` (default: all runs see the first run's batches,
      and record its data seed as ``training.data_seed``) or ``"per_run"``
      (each run its own seed's batches, as it would alone); default
      ``configs[0].sweep.data_order`` if set.

  Returns:
    One summary per run, as ``train.train_and_evaluate`` returns.

  Raises:
    ConfigError: runs that differ outside the sweepable keys (one line),
      two runs in one workdir, a workdir of another run, or runs that
      stopped at different steps.
  """
  configs = list(configs)
  workdirs = [os.fspath(w) for w in workdirs]
  if len(configs) != len(workdirs):
    raise ConfigError(f"a sweep of {len(configs)} configs needs as many "
                      f"workdirs, got {len(workdirs)}")
  real = [os.path.realpath(w) for w in workdirs]
  if len(set(real)) != len(real):
    twice = next(w for w, r in zip(workdirs, real) if real.count(r) > 1)
    raise ConfigError(f"two runs of the sweep share the workdir {twice}")
  shard = shard or spec.section_option(configs[0], "shard", "batch")
  data_order = data_order or spec.section_option(configs[0], "data_order",
                                                 "shared")
  configs = spec.with_data_seed([spec.without_section(c) for c in configs],
                                data_order)
  names = list(names) if names is not None else [
      os.path.basename(os.path.normpath(w)) for w in workdirs]
  spec.check_configs(configs, names)   # before any workdir is touched
  locks = []
  try:
    for w in workdirs:
      lock = workdir_lib.WorkdirLock(w)
      lock.acquire()
      locks.append(lock)
    return summary.report(configs, names, train.train_runs(
        configs, workdirs, names=names, shard=shard, sweep=True),
                          enabled=jax.process_index() == 0)
  finally:
    for lock in locks:
      lock.release()


def _write_sweep_record(root: str, record: dict[str, Any]) -> None:
  atomic.write_json(os.path.join(root, SWEEP_FILE), record, sort_keys=True)


def train_from_config(config: ml_collections.ConfigDict, workdir: str
                      ) -> list[dict[str, Any]]:
  """``train.py`` with a ``config.sweep`` section: the runs it describes
  (:func:`fkjax.training.sweep.expand`) in ``workdir/<run name>/``, and
  ``workdir/sweep.json`` listing them."""
  runs = spec.expand(config)
  if not runs:
    raise ConfigError("config.sweep describes no run")
  shard = spec.section_option(config, "shard", "batch")
  data_order = spec.section_option(config, "data_order", "shared")
  workdirs = [os.path.join(workdir, name) for name, _, _ in runs]
  _write_sweep_record(workdir, {
      "runs": [{"name": name, "overrides": overrides}
               for name, overrides, _ in runs],
      "shard": shard, "data_order": data_order})
  return train_sweep([c for _, _, c in runs], workdirs,
                     names=[name for name, _, _ in runs], shard=shard,
                     data_order=data_order)
