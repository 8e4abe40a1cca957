"""Which runs a table has at a scale: each (row, seed) with its config,
workdir and exact ``train.py`` / ``eval.py`` commands, kept in step with its
copy under ``results/`` (:mod:`reproduce.run.archive`)."""
from __future__ import annotations

import os
import shlex
import shutil
from typing import Any, Collection, Iterable, Mapping

import ml_collections

from fkjax.config import record as run_config
from fkjax import workdir as workdir_lib
from fkjax.training import precision
from reproduce.run import archive as archive_lib
from reproduce.run import progress as progress_lib
from reproduce.run import runs as runs_lib
from reproduce.run import standing as standing_lib
from reproduce.run.runs import ExtraEvalRun, Run
from reproduce.spec import scales as scales_lib
from reproduce.spec import tables as tables_lib

DEFAULT_ROOT = "workdirs/reproduce"
DEFAULT_RESULTS = "results"


def _extra_eval_run(protocol: str, overrides: dict[str, Any],
                    config: ml_collections.ConfigDict, workdir: str
                    ) -> ExtraEvalRun:
  cfg = runs_lib.with_overrides(config, overrides)
  if cfg.eval.get("protocol") == "strong":
    columns, attacks = ("A_strong",), "APGD-CE, APGD-DLR" + (
        ", APGD-T" if cfg.eval.strong.targeted else "")
  else:
    names = cfg.eval.attacks.split(",")
    columns = tuple(c for c, a in tables_lib.ATTACK_OF.items() if a in names)
    attacks = cfg.eval.attacks
  return ExtraEvalRun(
      protocol=protocol, overrides=overrides, result_file=_result_file(cfg),
      command=_command("eval.py", [f"--workdir={workdir}", *(
          f"--config.{k}={scales_lib.format_value(v)}"
          for k, v in overrides.items())]),
      columns=columns, attacks=attacks)


def num_seeds(table: tables_lib.Table, row: tables_lib.Row,
              scale: scales_lib.Scale, override: int | None) -> int:
  if override is not None:
    return override
  key = scale.settings_key
  return row.seeds.get(key, table.seeds.get(key, scale.seeds))


def workdir_of(root: str, scale: str, table: str, row: str, seed: int) -> str:
  return os.path.join(root, scale, table, f"{row}_seed{seed}")


def _command(program: str, args: Iterable[str]) -> str:
  return " ".join(["python", program, *(shlex.quote(a) for a in args)])


def plan(table: tables_lib.Table, scale: scales_lib.Scale, *,
         root: str = DEFAULT_ROOT, rows: Iterable[str] | None = None,
         seeds: int | None = None,
         environment: Mapping[str, Any] | None = None,
         results: str | None = None,
         restore: bool | Collection[str] = True,
         sync: bool = True) -> list[Run]:
  """The runs of ``table`` at ``scale`` (only ``rows`` if given).

  With ``results`` (the results directory), each run is kept in step with
  its copy there (:mod:`reproduce.run.archive`): a finished run missing
  from its workdir (a fresh checkout) is restored from it (unless
  ``restore`` is False, or a collection of workdirs that holds its own: it
  then trains again), and a finished run not yet copied there is copied.
  ``sync=False`` copies nothing either way (a dry run writes nothing:
  :func:`reproduce.run.standing.status_view` reads a run's copy where its
  workdir is empty).
  """
  runs = []
  for name in list(rows) if rows else table.row_names:
    row = table.row(name)
    for seed in range(num_seeds(table, row, scale, seeds)):
      run = _planned_run(table, row, scale, seed, root, environment)
      if results is not None:
        run.archive = archive_lib.archive_dir(
            results, scale.name, run.owner_table, run.owner_row.name, seed)
        if sync:
          sync_archive(run, restore if isinstance(restore, bool)
                       else run.workdir not in restore)
      # Results named before subsets said _n<N> are read where they are
      # (standing.main_result_path, kept_result): renamed here, they would
      # reach results/ as copies.
      runs.append(run)
  return runs


def _planned_run(table: tables_lib.Table, row: tables_lib.Row,
                 scale: scales_lib.Scale, seed: int, root: str,
                 environment: Mapping[str, Any] | None) -> Run:
  """One seed of ``row``: its config (its owner's, for a shared row),
  workdir, commands and extra evaluations."""
  if row.shared:
    owner_table, owner = tables_lib.resolve_shared(row)
    owner_name = owner_table.name
  else:
    owner_name, owner = table.name, row
  config = scales_lib.build_config(owner.presets, owner.overrides, scale,
                                   seed, environment)
  if row.shared:
    mine = scales_lib.build_config(row.presets, row.overrides, scale,
                                   seed, environment)
    diffs = run_config.differences(run_config.as_dict(config),
                                   run_config.as_dict(mine),
                                   ignore_environment=False)
    if diffs:
      raise ValueError(f"{table.name}/{row.name} shares {row.shared} "
                       f"but their configs differ: {diffs[:3]}")
  workdir = workdir_of(root, scale.name, owner_name, owner.name, seed)
  presets = scales_lib.row_presets(owner.presets, scale)
  flags = scales_lib.config_flags(config, presets)
  train_cmd = _command("train.py", [
      f"--config=configs/default.py:{presets}", *flags,
      f"--workdir={workdir}"])
  eval_cmd = _command("eval.py", [f"--workdir={workdir}"])
  extra = []
  for spec in table.extra_evals:
    if seed >= spec.max_seeds.get(scale.settings_key, 1 << 30):
      continue
    overrides = dict(spec.overrides.get(scale.settings_key, {}))
    overrides.setdefault("eval.protocol", spec.protocol)
    extra.append(_extra_eval_run(spec.protocol, overrides, config, workdir))
  # As train.py records it: its fingerprint is the one of the run it makes
  # here (precision "auto" is float32 on a CPU, tf32 on a GPU). The config
  # is this run's own (built above; the commands and extra evaluations are
  # already made from it).
  precision.resolve(config)
  return Run(table, row, owner_name, owner, seed, workdir, config,
             train_cmd, eval_cmd, _result_file(config), extra,
             publish=scale.publish_weights)


def sync_archive(run: Run, restore: bool = True) -> None:
  """Restores a finished run missing from its workdir from its archive, or
  archives a finished run not yet kept there."""
  assert run.archive is not None
  if standing_lib.finished(run):
    if archive_lib.differs(run.workdir, run.archive):
      archive_lib.save(run.workdir, run.archive)
    return
  if not (restore and archive_lib.restore(run.workdir, run.archive)):
    return
  if not standing_lib.finished(run):
    # Its settings changed since it ran: it runs again from scratch.
    shutil.rmtree(run.workdir)
    return
  progress_lib.log(f"{run.owner_table}/{run.owner_row.name} seed "
                   f"{run.seed}: restored the finished run from "
                   f"{run.archive}")


def plan_report(table: tables_lib.Table, scale: scales_lib.Scale, *,
                root: str = DEFAULT_ROOT, seeds: int | None = None,
                environment: Mapping[str, Any] | None = None,
                results: str | None = None,
                restore: bool | Collection[str] = True) -> list[Run]:
  """The runs a table reports: every row, its planned seeds and any further
  seeds already finished on disk (a run with more ``--seeds`` earlier)."""
  runs = plan(table, scale, root=root, seeds=seeds, environment=environment,
              results=results, restore=restore)
  out = []
  for row in table.rows:
    mine = [r for r in runs if r.row.name == row.name]
    out += mine
    seed = len(mine)
    while True:
      extra = plan(table, scale, root=root, rows=[row.name], seeds=seed + 1,
                   environment=environment, results=results,
                   restore=restore)[-1]
      if not standing_lib.finished(extra):
        break
      out.append(extra)
      seed += 1
  return out


def _result_file(config: ml_collections.ConfigDict) -> str:
  return os.path.basename(workdir_lib.eval_result_path("", config))
