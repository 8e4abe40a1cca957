"""Trains and evaluates every row of a table, then writes the table.

Each (row, seed) is a *run* in its own workdir, ``<root>/<scale>/<table>/
<row>_seed<k>`` (a row shared with another table runs in that table's
workdir). A run goes through stages, each skipped when its result exists:

1. ``train``: ``fkjax.training.train.train_and_evaluate`` (resumes from the last
   checkpoint after a kill; ends with train.py's own ``final_eval.json``);
2. ``eval``: ``fkjax.evaluation.run.evaluate_checkpoint`` (``eval_paper.json``);
3. one stage per extra evaluation of the table (``eval_<protocol>.json``);
4. ``analysis``: weight statistics (:mod:`reproduce.analysis`);
5. ``publish`` (scales that publish weights): the evaluated weights,
   ``weights.npz`` (:mod:`reproduce.weights`).

Then ``reproduce_run.json`` records the run: the exact equivalent
``train.py`` / ``eval.py`` commands, the wall time of each stage (kept across
kills to within :data:`HEARTBEAT_SECONDS`) and the metrics. After every run
the table is rewritten (``results/<scale>/<table>.json`` and ``.md``, and its
figures), so a killed runner leaves a table of the runs finished so far.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shlex
import shutil
import threading
import time
from typing import (Any, Callable, Collection, Iterable, Mapping, Optional,
                    Tuple)

import ml_collections

from configs import default as default_config
from fkjax import atomic
from fkjax.config import history
from fkjax.config import keys as config_keys
from fkjax.evaluation import journal as eval_journal
from fkjax.evaluation import strong_result as eval_strong_result
from fkjax.config import record as run_config
from fkjax import workdir as workdir_lib
from reproduce import archive as archive_lib
from reproduce import files
from reproduce import scales as scales_lib
from reproduce import tables as tables_lib
from reproduce import weights as weights_lib

RUN_RECORD = archive_lib.RUN_RECORD
PROGRESS_FILE = archive_lib.PROGRESS_FILE
HEARTBEAT_SECONDS = 10.0
DEFAULT_ROOT = "workdirs/reproduce"
DEFAULT_RESULTS = "results"

# The order of ``all``: tables whose rows others share come first.
ORDER = ("table1", "table2", "table3", "fig45", "table4", "table5", "table6",
         "sec3", "table7")


@dataclasses.dataclass
class ExtraEvalRun:
  """An extra evaluation of one run: what it fills and how it is read.

  Attributes:
    protocol: its stage is ``eval_<protocol>``.
    overrides: ``config.eval`` keys (eval.py flags), ``eval.protocol`` set.
    result_file: what it writes in the workdir.
    command: the equivalent ``eval.py`` command.
    columns: the metric columns it fills (``tables.METRICS`` keys).
    attacks: what it runs, for the log.
  """
  protocol: str
  overrides: dict[str, Any]
  result_file: str
  command: str
  columns: tuple[str, ...]
  attacks: str

  def read(self, result: Mapping[str, Any]) -> dict[str, float]:
    """Its columns from its result file's data (empty where it lacks them);
    the strong protocol's one column is its worst case over its attacks."""
    if self.columns == ("A_strong",):
      if result.get("protocol") != "strong":
        return {}
      strong = eval_strong_result.StrongResult.from_json(result)
      return {"A_strong": strong.worst_case.accuracy}
    attacks = result.get("attacks", {})
    return {c: attacks[tables_lib.ATTACK_OF[c]]["accuracy"]
            for c in self.columns if tables_lib.ATTACK_OF[c] in attacks}


def _extra_eval_run(protocol: str, overrides: dict[str, Any],
                    config: ml_collections.ConfigDict, workdir: str
                    ) -> ExtraEvalRun:
  cfg = _with(config, overrides)
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


@dataclasses.dataclass
class Run:
  """One (row, seed) of a table at a scale, with everything to run it."""
  table: tables_lib.Table
  row: tables_lib.Row
  owner_table: str
  owner_row: tables_lib.Row
  seed: int
  workdir: str
  config: ml_collections.ConfigDict
  train_command: str
  eval_command: str
  eval_result: str
  extra_evals: list[ExtraEvalRun]
  # <results>/<scale>/runs/<table>/<row>_seed<k>: where the finished run's
  # files are kept (reproduce.archive); None: not kept.
  archive: str | None = None
  # keep its evaluated weights (weights.npz) with its results: the scale's
  # publish_weights
  publish: bool = False

  @property
  def key(self) -> str:
    return f"{self.owner_table}/{self.owner_row.name}_seed{self.seed}"


def log(message: str) -> None:
  """A progress line, flushed (the runner's output is usually a log file)."""
  stamp = time.strftime("%H:%M:%S")
  print(f"[reproduce {stamp}] {message}", flush=True)


# --------------------------------------------------------------------------
# Planning.


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
  its copy there (:mod:`reproduce.archive`): a finished run missing
  from its workdir (a fresh checkout) is restored from it (unless
  ``restore`` is False, or a collection of workdirs that holds its own: it
  then trains again), and a finished run not yet copied there is copied.
  ``sync=False`` copies nothing either way (a dry run writes nothing:
  :func:`status_view` reads a run's copy where its workdir is empty).
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
      # (_main_result_path, kept_result): renamed here, they would reach
      # results/ as copies.
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
  return Run(table, row, owner_name, owner, seed, workdir, config,
             train_cmd, eval_cmd, _result_file(config), extra,
             publish=scale.publish_weights)


def sync_archive(run: Run, restore: bool = True) -> None:
  """Restores a finished run missing from its workdir from its archive, or
  archives a finished run not yet kept there."""
  assert run.archive is not None
  if finished(run):
    if archive_lib.differs(run.workdir, run.archive):
      archive_lib.save(run.workdir, run.archive)
    return
  if not (restore and archive_lib.restore(run.workdir, run.archive)):
    return
  if not finished(run):
    # Its settings changed since it ran: it runs again from scratch.
    shutil.rmtree(run.workdir)
    return
  log(f"{run.owner_table}/{run.owner_row.name} seed {run.seed}: restored "
      f"the finished run from {run.archive}")


def status_view(run: Run) -> Run:
  """``run`` as its files say where it stands: its workdir, or where that
  is empty and a finished copy is kept under ``results/``, that copy
  (read only; it has no checkpoints)."""
  if (run.archive is not None and archive_lib.is_empty(run.workdir)
      and files.load_json(os.path.join(run.archive, RUN_RECORD))):
    return dataclasses.replace(run, workdir=run.archive)
  return run


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
      if not finished(extra):
        break
      out.append(extra)
      seed += 1
  return out


def _with(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
          ) -> ml_collections.ConfigDict:
  new = ml_collections.ConfigDict(run_config.as_dict(config))
  for key, value in overrides.items():
    config_keys.set_value(new, key, value, must_exist=True)
  return new


def _result_file(config: ml_collections.ConfigDict) -> str:
  return os.path.basename(workdir_lib.eval_result_path("", config))


# --------------------------------------------------------------------------
# Time accounting that survives kill -9.


class Progress:
  """``<workdir>/reproduce_progress.json``: seconds and state of each stage.

  While a stage runs, a thread writes its elapsed time every
  :data:`HEARTBEAT_SECONDS`, so a killed stage's time is kept (all but the
  last few seconds) and the resumed attempt adds to it.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, PROGRESS_FILE)
    self.data: dict[str, Any] = {"stages": {}}
    if os.path.exists(self.path):
      try:
        with open(self.path) as f:
          self.data = json.load(f)
      except ValueError:   # a torn write cannot happen (atomic); be safe
        pass
    self._lock = threading.Lock()

  def stage(self, name: str) -> dict[str, Any]:
    return self.data["stages"].setdefault(
        name, {"seconds": 0.0, "attempts": 0, "done": False})

  def done(self, name: str, fingerprint: str) -> bool:
    s = self.data["stages"].get(name)
    return bool(s and s["done"] and s.get("fingerprint") == fingerprint)

  def kept(self) -> dict[str, str]:
    """Stage -> the fingerprint it was done with, for the stages done."""
    return {k: s.get("fingerprint", "")
            for k, s in self.data["stages"].items() if s.get("done")}

  def _save(self) -> None:
    with self._lock:
      atomic.write_json(self.path, self.data)

  def timed(self, name: str, fingerprint: str, fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` as stage ``name``, accounting its wall time."""
    return _timed_together([self], name, [fingerprint], fn)


def _computed(config: ml_collections.ConfigDict | Mapping[str, Any],
              with_eval: bool,
              saved_keys: set[str] | None = None) -> dict[str, Any]:
  """The keys that change what a stage computes: all but the environment
  keys (where data live, progress output, ...), and ``eval.*`` if asked.

  With ``saved_keys`` (those of the run's saved config), a key added to
  fkjax's defaults after the run was trained counts only once it is set: an
  unset placeholder keeps the old behaviour, so it must not mark finished
  runs as changed (``run_config.differences`` reads configs the same way).
  """
  data = (run_config.as_dict(config)
          if isinstance(config, ml_collections.ConfigDict) else config)
  return {k: v for k, v in run_config.flatten(data).items()
          if (not run_config.is_environment_key(k)
              or (with_eval and k.startswith("eval.")))
          and (saved_keys is None or k in saved_keys or v is not None)}


def _fingerprint(data: Any) -> str:
  blob = json.dumps(data, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:16]




# --------------------------------------------------------------------------
# Running.


def check_workdir(run: Run) -> None:
  """Refuses a workdir that holds a run of another config."""
  saved = run_config.load_saved(run.workdir)
  if saved is None:
    return
  diffs = run_config.differences(saved, run_config.as_dict(run.config))
  if diffs:
    shown = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in diffs[:3])
    raise run_config.ConfigError(
        f"{run.workdir} holds a run of another config ({shown}): the table "
        "definitions or fkjax's defaults changed since it was trained. Use "
        "another --root, or remove the workdir to retrain it")


def fingerprints(run: Run) -> dict[str, str]:
  """Per stage, a hash of the settings that change what it computes."""
  saved = run_config.load_saved(run.workdir)
  keys = set(run_config.flatten(saved)) if saved is not None else None
  out = {"train": _fingerprint(_computed(run.config, False, keys)),
         "eval": _fingerprint(_computed(run.config, True, keys))}
  for extra in run.extra_evals:
    out[f"eval_{extra.protocol}"] = _fingerprint(_computed(
        _with(run.config, extra.overrides), True, keys))
  return out


# --------------------------------------------------------------------------
# Where each stage of a finished run stands against the settings of now.
#
# A stage's fingerprint (kept in the run's record and progress file) is a
# hash of the settings it ran with: equal to the one of now, the stage is
# current. Otherwise the settings it ran with are read back from the file
# they were recorded in (config.json for training and the main evaluation,
# the result file of an extra evaluation), found by that same hash, and
# compared with those of now, key by key: the training by its own keys
# only, an evaluation by its eval.* keys only (a paper-protocol one not by
# the strong protocol's). fkjax.config.history reads a key the record lacks
# (added since) as the value that reproduced the run, and names the older
# default a stage ran with (where the table asks for today's default, not a
# value of its own); any other difference means that the stage ran with
# other settings, and runs again.

# A stage that ran with today's settings, or with these older defaults
# (descriptions, fkjax.config.history.Change.describe); None: not done with
# the settings of now.
Standing = Optional[Tuple[str, ...]]


def _stage_config(run: Run, stage: str) -> ml_collections.ConfigDict:
  if stage in ("train", "eval"):
    return run.config
  extra = next(e for e in run.extra_evals if f"eval_{e.protocol}" == stage)
  return _with(run.config, extra.overrides)


def _compared_keys(stage: str, config: Mapping[str, Any]) -> set[str]:
  """The keys that decide whether ``stage``, run with ``config`` (flat),
  is current."""
  if stage == "train":
    return {k for k in config if not run_config.is_environment_key(k)}
  strong = config.get("eval.protocol") == "strong"
  return {k for k in config if k.startswith("eval.")
          and (strong or not k.startswith("eval.strong."))}


def _recorded(run: Run, stage: str, fingerprint: str
              ) -> tuple[dict[str, Any], str] | None:
  """The settings ``stage`` ran with, as recorded beside its result, and
  that file: the one whose settings hash to ``fingerprint`` (None: none
  does)."""
  with_eval = stage != "train"
  if stage in ("train", "eval"):
    saved = run_config.load_saved(run.workdir)
    candidates = [(saved, run_config.config_path(run.workdir))]
  else:
    candidates = []
    for path in sorted(glob.glob(os.path.join(run.workdir,
                                              f"{stage}*.json"))):
      data = files.load_json(path) or {}
      candidates.append((data.get("metadata", {}).get("config"), path))
  for settings, path in candidates:
    if isinstance(settings, dict) and _fingerprint(
        _computed(settings, with_eval)) == fingerprint:
      return settings, path
  return None


def _standing(run: Run, stage: str, fingerprint: str | None,
              now_fingerprint: str | None = None) -> Standing:
  """Where ``stage``, done with ``fingerprint``, stands (see above);
  ``now_fingerprint``: its fingerprint now, where already computed."""
  if not fingerprint:
    return None
  if fingerprint == (now_fingerprint or fingerprints(run)[stage]):
    return ()
  found = _recorded(run, stage, fingerprint)
  if found is None:
    return None
  ran = run_config.flatten(history.complete(found[0]))
  now = run_config.flatten(run_config.as_dict(_stage_config(run, stage)))
  older = []
  for key in sorted(_compared_keys(stage, now) | _compared_keys(stage, ran)):
    if key not in ran or ran[key] == now.get(key):
      continue   # a key added since that history does not list: as it ran
    if key in history.SPEED_ONLY:
      continue   # the same results whatever its value
    change = history.older(key, ran[key], now.get(key))
    if change is None or now.get(key) != _default(key):
      return None   # another setting, or one the table asks for itself
    older.append(change.describe(now.get(key)))
  return tuple(older)


def _default(key: str) -> Any:
  """``key``'s default in configs/default.py (None where it has none)."""
  value = default_config.DEFAULTS.get(key)
  if isinstance(value, default_config.Nullable):
    return value.default
  return list(value) if isinstance(value, tuple) else value


def standings(run: Run, kept: Mapping[str, str] | None = None
              ) -> dict[str, Standing]:
  """Per stage (``train``, ``eval``, ``eval_<protocol>``), where it stands
  by the fingerprints ``kept`` (default: the finished run's record's)."""
  if kept is None:
    record = files.load_json(os.path.join(run.workdir, RUN_RECORD)) or {}
    kept = record.get("fingerprints", {}) if record.get("done") else {}
  return {stage: _standing(run, stage, kept.get(stage), now)
          for stage, now in fingerprints(run).items()}


def kept_result(run: Run, extra: ExtraEvalRun, fingerprint: str | None
                 ) -> ExtraEvalRun:
  """``extra`` reading the file its result done with ``fingerprint`` is
  in: named by older settings, or before subsets said ``_n<N>``."""
  found = (_recorded(run, f"eval_{extra.protocol}", fingerprint)
           if fingerprint else None)
  if found is None:
    return extra
  return dataclasses.replace(extra, result_file=os.path.basename(found[1]))


def _main_result_path(run: Run) -> str:
  """The main evaluation's result file (:func:`fkjax.workdir.
  existing_eval_result`: perhaps named before subsets said ``_n<N>``)."""
  return (workdir_lib.existing_eval_result(run.workdir, run.config)
          or os.path.join(run.workdir, run.eval_result))


def _train_done(run: Run) -> bool:
  if run.config.eval.final_attacks:
    path = os.path.join(run.workdir, "final_eval.json")
    return files.load_json(path) is not None
  from fkjax.workdir import metric_logging  # pylint: disable=import-outside-toplevel
  epochs = [r.get("epoch") for r in metric_logging.read_metrics(run.workdir)]
  return run.config.training.num_epochs in epochs


def execute(run: Run, *, show_progress: bool = True,
            extra_evals: bool = True) -> dict[str, Any]:
  """Runs the stages of ``run`` that are not done; returns its record.

  ``show_progress``: progress output (a bar on a terminal, else a plain line
  every 30 s, see :func:`fkjax.workdir.metric_logging.progress`). ``extra_evals``:
  False leaves the extra evaluations not yet done pending
  (:func:`pending_evals`): the run is finished and reported without their
  columns, and a later call with True runs them alone.
  """
  # JAX only now: planning and dry runs never load it.
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  from fkjax.training import devices  # pylint: disable=import-outside-toplevel

  config = _with(run.config, {"progress": show_progress})
  check_workdir(run)
  os.makedirs(run.workdir, exist_ok=True)
  progress = Progress(run.workdir)
  progress.data.pop("error", None)
  devices.enable_compilation_cache(config)
  fps = fingerprints(run)
  exp_cache: dict[str, Any] = {}

  def exp():
    if "exp" not in exp_cache:
      exp_cache["exp"] = build.Experiment.build(config)
    return exp_cache["exp"]

  what = f"{run.table.name}/{run.row.name} seed {run.seed}"
  _core_stages(run, config, progress, fps, exp, what)
  # The run is reportable from here on, its extra evaluations pending; the
  # record is written again after each of them, so a run stopped during
  # the last one (an hour on a CPU) keeps the columns of those before it.
  record = _save_record(run, progress)
  for extra in run.extra_evals if extra_evals else ():
    stage = f"eval_{extra.protocol}"
    cfg = _with(config, extra.overrides)
    fp = fps[stage]
    # One made with older defaults (fkjax.config.history) runs again: its
    # file, named by those settings, stays.
    path = workdir_lib.existing_eval_result(run.workdir, cfg)
    if not (_standing(run, stage, progress.kept().get(stage)) == ()
            and path and files.load_json(path)):
      log(f"{what}: extra evaluation {extra.protocol} "
          f"({extra.attacks}, {cfg.eval.num_examples or 'all'} images)")
      progress.timed(stage, fp, lambda cfg=cfg: eval_run.evaluate_checkpoint(
          cfg, run.workdir, exp=exp()))
      record = _save_record(run, progress)
  exp_cache.clear()
  jax.clear_caches()
  return record


def _core_stages(run: Run, config: ml_collections.ConfigDict,
                 progress: Progress, fps: Mapping[str, str],
                 exp: Callable[[], Any], what: str) -> None:
  """Trains, evaluates (A1-A4), analyses and publishes ``run``: each stage
  not done with its current fingerprint."""
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  from fkjax.training import train  # pylint: disable=import-outside-toplevel
  from reproduce import analysis  # pylint: disable=C0415
  train_fp, eval_fp = fps["train"], fps["eval"]
  kept = progress.kept()
  # A training made with older defaults (fkjax.config.history) is never
  # run again; an evaluation is, where it can be.
  if not (_standing(run, "train", kept.get("train")) is not None
          and _train_done(run)):
    log(f"{what}: training in {run.workdir}")
    progress.timed("train", train_fp,
                   lambda: train.train_and_evaluate(config, run.workdir))
  if not (_standing(run, "eval", kept.get("eval")) == ()
          and files.load_json(_main_result_path(run))):
    log(f"{what}: evaluating ({config.eval.attacks})")
    progress.timed("eval", eval_fp, lambda: eval_run.evaluate_checkpoint(
        config, run.workdir, exp=exp()))
  # The analysis and the published weights are of the evaluated checkpoint.
  apath = os.path.join(run.workdir, analysis.ANALYSIS_JSON)
  if not (_standing(run, "eval", kept.get("analysis")) is not None
          and files.load_json(apath)):
    progress.timed("analysis", eval_fp,
                   lambda: analysis.analyze_run(config, run.workdir, exp=exp()))
  wpath = os.path.join(run.workdir, weights_lib.WEIGHTS_FILE)
  if run.publish and not (
      _standing(run, "eval", kept.get("publish")) is not None
      and os.path.exists(wpath)):
    progress.timed("publish", eval_fp,
                   lambda: weights_lib.publish(config, run.workdir, exp=exp()))


# --------------------------------------------------------------------------
# Sweeps (--sweep): runs that differ only in seeds or hyperparameters train
# as one program (fkjax.training.sweep), then each goes through its other stages.


def _train_pending(run: Run) -> bool:
  progress = Progress(run.workdir)
  return not (progress.done("train", fingerprints(run)["train"])
              and _train_done(run))


def sweep_groups(runs: Iterable[Run], max_runs: int | None = None
                 ) -> list[list[Run]]:
  """The runs whose training is not done, grouped into sweeps: runs that
  differ only in :data:`fkjax.training.sweep.SWEEPABLE_KEYS` (a row's seeds; rows
  differing in lambda1, beta, ...), at most ``max_runs`` a group. A group
  of one trains alone."""
  from fkjax.training import sweep as sweep_lib  # pylint: disable=C0415
  seen, pending = set(), []
  for run in runs:
    if run.workdir not in seen and _train_pending(run):
      pending.append(run)
    seen.add(run.workdir)
  return [[pending[i] for i in members] for members in
          sweep_lib.groups([r.config for r in pending], max_runs)]


def _timed_together(progresses: list[Progress], name: str,
                    fingerprints_: list[str], fn: Callable[[], Any]) -> Any:
  """Runs ``fn`` as stage ``name`` of one or several runs (a sweep): each
  run is charged its share of the wall time, saved every heartbeat so that
  a kill keeps what was spent."""
  stages = [p.stage(name) for p in progresses]
  for s, fp in zip(stages, fingerprints_):
    s["attempts"] += 1
    s["done"] = False
    s["fingerprint"] = fp
    if len(progresses) > 1:
      s["sweep_runs"] = len(progresses)
  bases = [s["seconds"] for s in stages]
  start = time.monotonic()
  stop = threading.Event()

  def update():
    share = (time.monotonic() - start) / len(progresses)
    for p, s, base in zip(progresses, stages, bases):
      s["seconds"] = base + share
      p._save()   # pylint: disable=protected-access

  def beat():
    while not stop.wait(HEARTBEAT_SECONDS):
      update()
  thread = threading.Thread(target=beat, daemon=True)
  update()
  thread.start()
  try:
    result = fn()
  finally:
    stop.set()
    thread.join()
    update()
  for p, s in zip(progresses, stages):
    s["done"] = True
    p._save()   # pylint: disable=protected-access
  return result


def train_in_sweeps(runs: Iterable[Run], *, max_runs: int | None = None,
                    show_progress: bool = True) -> list[str]:
  """Trains the runs of every group of :func:`sweep_groups` with two or more
  runs as one ``fkjax.training.sweep.train_sweep`` program; returns their keys.

  Each run's workdir ends up as its own training leaves it (``data_order=
  "per_run"``: every run sees its own seed's batches, so its config and
  numbers are the single run's, to float rounding) and its train stage is
  marked done, with its share of the sweep's wall time; :func:`execute`
  then runs its other stages. A group that fails leaves its runs to train
  one at a time.
  """
  from fkjax.training import devices  # pylint: disable=C0415
  from fkjax.training import sweep as sweep_lib  # pylint: disable=C0415
  trained = []
  for group in sweep_groups(runs, max_runs):
    if len(group) < 2:
      continue
    keys = [r.key for r in group]
    log(f"sweep of {len(group)} runs as one program: {', '.join(keys)}")
    configs = [_with(r.config, {"progress": show_progress}) for r in group]
    try:
      for run in group:
        check_workdir(run)
        os.makedirs(run.workdir, exist_ok=True)
      devices.enable_compilation_cache(configs[0])
      progresses = [Progress(r.workdir) for r in group]
      for p in progresses:
        p.data.pop("error", None)
      _timed_together(
          progresses, "train", [fingerprints(r)["train"] for r in group],
          lambda: sweep_lib.train_sweep(
              configs, [r.workdir for r in group], names=keys,
              data_order="per_run"))
    except Exception as e:  # pylint: disable=broad-except
      log(f"the sweep of {', '.join(keys)} failed ({type(e).__name__}: "
          f"{e}); its runs train one at a time")
      continue
    trained += keys
  return trained


def main_eval(run: Run) -> dict[str, Any]:
  """A run's main evaluation result (``{}`` where it has none)."""
  return files.load_json(_main_result_path(run)) or {}


# The columns the main evaluation's result file fills (metrics_of).
MAIN_EVAL_COLUMNS = (*tables_lib.ATTACK_OF, "sparsity", "channel_sparsity",
                     "w_A1", "w_A2", "w_A3")


def metrics_of(workdir: str, eval_result: str,
               extra: Iterable[ExtraEvalRun] = (),
               main: Mapping[str, Any] | None = None) -> dict[str, float]:
  """The metric columns of a finished run (see ``tables.METRICS``);
  ``main``: its main evaluation's result, where already read."""
  out: dict[str, float] = {}
  if main is None:
    main = files.load_json(os.path.join(workdir, eval_result)) or {}
  for column, attack in tables_lib.ATTACK_OF.items():
    entry = main.get("attacks", {}).get(attack)
    if entry is not None:
      out[column] = entry["accuracy"]
  if "weight_sparsity" in main:
    out["sparsity"] = main["weight_sparsity"]
    out["channel_sparsity"] = main["channel_sparsity"]
  dense = main.get("admm_dense_w", {}).get("attacks", {})
  for column in ("A1", "A2", "A3"):
    if tables_lib.ATTACK_OF[column] in dense:
      out[f"w_{column}"] = dense[tables_lib.ATTACK_OF[column]]["accuracy"]
  for e in extra:
    data = files.load_json(os.path.join(workdir, e.result_file)) or {}
    # The main evaluation's column wins over an extra one of the same attack.
    for column, value in e.read(data).items():
      out.setdefault(column, value)
  stats = files.load_json(os.path.join(workdir, "analysis.json"))
  if stats:
    out["small_share"] = stats["w"]["small_share"]
    out["w_sparsity"] = stats["w"]["zero_share"]
    out["w_channel_sparsity"] = stats["w"]["channel_sparsity"]
    out["w_small_share"] = stats["w"]["small_share"]
    out["w_small_channel_share"] = stats["w"]["small_channel_share"]
  return out


def correct_per_image_of(main: Mapping[str, Any]) -> dict[str, str]:
  """Column (A1...) -> which test images the main evaluation's attack left
  right (``fkjax.workdir.encode_correct``), from its result ``main``; empty
  for an evaluation written before evaluations kept them."""
  kept = main.get("correct_per_image", {})
  return {column: kept[attack] for column, attack in
          tables_lib.ATTACK_OF.items() if attack in kept}


def commands_of(run: Run) -> dict[str, str]:
  """The exact equivalent commands of a run, in an order they can run in
  (the analysis and the extra evaluations do not depend on each other)."""
  return {"train": run.train_command, "eval": run.eval_command,
          **{f"eval_{e.protocol}": e.command for e in run.extra_evals},
          "analysis": ("python -m reproduce.analysis "
                       f"--workdir={shlex.quote(run.workdir)}")}


def make_record(run: Run, progress: Progress) -> dict[str, Any]:
  stages = progress.data.get("stages", {})
  # Each stage's fingerprint as it was done (with older defaults, perhaps);
  # an extra evaluation not run (execute's extra_evals=False) has none in
  # the record: pending_evals names it.
  kept = progress.kept()
  done = {k: kept[k] for k in fingerprints(run)
          if _standing(run, k, kept.get(k)) is not None}
  extras = [kept_result(run, e, done[f"eval_{e.protocol}"])
            for e in run.extra_evals if f"eval_{e.protocol}" in done]
  main = main_eval(run)
  metadata = main.get("metadata", {})
  return {
      "table": run.owner_table,
      "row": run.owner_row.name,
      "seed": run.seed,
      "presets": run.owner_row.presets,
      "overrides": dict(run.owner_row.overrides),
      "workdir": run.workdir,
      "commands": commands_of(run),
      "stage_seconds": {k: v["seconds"] for k, v in stages.items()},
      "stage_attempts": {k: v["attempts"] for k, v in stages.items()},
      # runs its training stage shared (fkjax.training.sweep, --sweep); 1: alone
      "train_sweep_runs": stages.get("train", {}).get("sweep_runs", 1),
      "wall_seconds": sum(v["seconds"] for v in stages.values()),
      "metrics": metrics_of(run.workdir, run.eval_result, extras, main),
      "test_images": main.get("num_examples"),
      "checkpoint_step": metadata.get("step"),
      "git_commit": metadata.get("git_commit"),
      "data": metadata.get("data"),
      # the main evaluation's machine: training's, unless resumed elsewhere
      "devices": metadata.get("devices"),
      "fingerprints": done,
      "done": True,
  }


def _save_record(run: Run, progress: Progress) -> dict[str, Any]:
  """Writes the run's record, then its copy under ``results/``."""
  record = make_record(run, progress)
  atomic.write_json(os.path.join(run.workdir, RUN_RECORD), record)
  if run.archive is not None:
    archive_lib.save(run.workdir, run.archive)
  return record


def record_failure(run: Run, error: BaseException) -> None:
  """Notes in the run's progress file that its last attempt failed."""
  progress = Progress(run.workdir)
  progress.data["error"] = f"{type(error).__name__}: {error}"
  progress._save()   # pylint: disable=protected-access


def _trained(run: Run, record: Mapping[str, Any] | None) -> bool:
  if not (record and record.get("done")):
    return False
  return _standing(run, "train",
                   record.get("fingerprints", {}).get("train")) is not None


def pending_evals(run: Run) -> list[ExtraEvalRun]:
  """The extra evaluations a finished run lacks, or ran with other settings
  (a column added to its table after it ran); not those made with older
  defaults (:func:`older_settings`)."""
  now = standings(run)
  return [e for e in run.extra_evals if now[f"eval_{e.protocol}"] is None]


def older_settings(run: Run) -> dict[str, tuple[str, ...]]:
  """Stage -> the older defaults it was made with (fkjax.config.history),
  for each stage of a finished run made so: kept and reported, marked."""
  return {stage: older for stage, older in standings(run).items() if older}


def evals_to_run(run: Run) -> list[str]:
  """The evaluation stages of a finished run that are not current: pending
  (:func:`pending_evals`), or made with older defaults (run again where
  its workdir has a checkpoint; a training never is)."""
  return [stage for stage, standing in standings(run).items()
          if stage != "train" and standing != ()]


def finished(run: Run) -> bool:
  """Trained with its current training settings (or older defaults:
  :func:`older_settings`) and evaluated: reportable, though an evaluation
  may be pending (:func:`evals_to_run`; evaluation settings never make a
  run train again)."""
  return _trained(run, files.load_json(os.path.join(run.workdir,
                                                    RUN_RECORD)))


def has_checkpoint(run: Run) -> bool:
  """Whether the workdir holds checkpoints (a run restored from results/
  does not: an evaluation it lacks cannot be run without training it)."""
  directory = os.path.join(run.workdir, "checkpoints")
  return os.path.isdir(directory) and bool(os.listdir(directory))


def status_of(run: Run) -> str:
  """``done``, ``done, eval_<protocol> not yet run``, ``to update``,
  ``failed: ...``, ``trained i/n epochs`` (with ``, evaluating (k batches
  done)`` where a killed evaluation kept some) or ``not started``."""
  record = files.load_json(os.path.join(run.workdir, RUN_RECORD))
  if record and record.get("done"):
    now = standings(run, record.get("fingerprints", {}))
    if now["train"] is not None:
      pending = [s for s in now if s != "train" and now[s] is None]
      status = ("done" if not pending else
                f"done, {', '.join(pending)} not yet run")
      older = {stage: o for stage, o in now.items() if o}
      if older:
        status += ", " + "; ".join(
            f"{stage} made with {', '.join(o)}" for stage, o in older.items())
      return status
    # a training setting changed since
    return "to update (settings changed since it ran)"
  progress = files.load_json(os.path.join(run.workdir, PROGRESS_FILE)) or {}
  if progress.get("error"):
    return f"failed ({progress['error'][:200]})"
  epochs = trained_epochs(run)
  if epochs is None:
    return "not started"
  status = f"trained {epochs}/{run.config.training.num_epochs} epochs"
  kept = eval_journal.batches_kept(run.workdir)
  if kept:
    status += f", evaluating ({kept} batch{'es' if kept > 1 else ''} done)"
  return status


def trained_epochs(run: Run) -> int | None:
  """The epochs its training log has finished (None: no log yet)."""
  if not os.path.exists(os.path.join(run.workdir, "metrics.jsonl")):
    return None
  from fkjax.workdir import metric_logging  # pylint: disable=import-outside-toplevel
  return max((r.get("epoch", 0) for r in metric_logging.read_metrics(
      run.workdir)), default=0)


# --------------------------------------------------------------------------
# Cost estimate (dry runs): 2 idle CPU cores, docs/performance.md.


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds of ResNet20 training steps at batch 128 on some machine.

  Attributes:
    clean_step: a clean training step.
    attack_iteration: one PGD iteration more in a step.
  """
  clean_step: float
  attack_iteration: float


# The reference machine's (2 idle vCPUs of an AMD EPYC with AVX-512):
# a clean step, one attack iteration; per image of one evaluation attack
# iteration; multipliers per ensemble size measured for PGD-10 steps (En2
# 4.07 s, En5 12.2 s vs ResNet20 1.73 s). Another machine's step times
# (reproduce.calibrate) scale the estimates.
REFERENCE_STEP_TIMES = StepTimes(clean_step=0.303, attack_iteration=0.1424)
_EVAL_ITER_PER_IMAGE = 10.08 / 500 / 21
_MEMBERS = {1: 1.0, 2: 2.36, 5: 7.06}
# A noise draw's gradient under the strong protocol costs more than the
# training multipliers say: En2ResNet20, 200 images, EOT 10 took 1,419 s of
# APGD (eval_strong.json) against 1,007 s predicted without this factor.
_NOISY_EOT_COST = 1.41
# Attack iterations per image of each paper-protocol attack but NAttack
# (costed by its queries below); keyed by fkjax.config.names.ATTACK_NAMES.
_EVAL_ITERS = {"natural": 1, "fgsm": 2, "ifgsm20": 21, "cw": 21,
               "cw_authors": 51}
# One NAttack query (a forward pass of one population sample) per image, in
# attack iterations: the cpu scale's A5 (100 images, population 50, 100
# iterations) took 299 and 443 s on ResNet20 and 892 and 998 s on
# En2ResNet20 (stage_seconds of results/cpu/runs/table{1,2}), 2.3x and 2.5x
# what a third of an iteration (a forward pass alone) predicts.
_NATTACK_QUERY_COST = 0.8


def model_cost(depth: int, ensemble_size: int) -> float:
  """A training step of EnResNet``depth`` with ``ensemble_size`` members in
  ResNet20 steps, as the estimates scale them (the reference machine's
  ratios)."""
  m = _MEMBERS.get(ensemble_size, 1.5 * ensemble_size)
  return m * (depth - 2) / 18


def estimate_seconds(run: Run, only: list[ExtraEvalRun] | None = None,
                     epochs_done: int = 0,
                     step_times: StepTimes = REFERENCE_STEP_TIMES,
                     main_eval: bool = False) -> float:
  """A rough wall-time estimate of ``run`` (``only``: of these extra
  evaluations alone, and of the main one if ``main_eval``;
  ``epochs_done``: what is left after that many epochs
  of its training) on a machine with these ResNet20 ``step_times`` (default:
  the reference machine's, 2 idle CPU cores). Evaluation scales with the
  attack iteration's time, compilation with the clean step's."""
  reference = REFERENCE_STEP_TIMES
  eval_iter_per_image = _EVAL_ITER_PER_IMAGE * (
      step_times.attack_iteration / reference.attack_iteration)
  c = run.config
  m = model_cost(c.model.depth, c.model.ensemble_size)
  k = c.attack.num_steps if c.training.adversarial else 0
  n_train = scales_lib.train_size(c)
  steps = scales_lib.steps_per_epoch(n_train, c) * c.training.num_epochs
  batch_scale = c.training.batch_size / 128
  train = steps * batch_scale * m * (step_times.clean_step
                                     + k * step_times.attack_iteration)
  n_val = c.validation.num_examples or c.dataset.val_size
  train += (c.training.num_epochs * n_val * m * eval_iter_per_image
            * (1 + c.validation.attack_steps))
  train *= max(0.0, 1.0 - epochs_done / c.training.num_epochs)

  def eval_cost(cfg):
    n = cfg.eval.num_examples or 10000
    if cfg.eval.get("protocol") == "strong":
      # APGD-CE + APGD-DLR (+ APGD-T per target), each num_iters + 1
      # gradients of eot_samples draws and a check of check_draws forward
      # passes (a third of a gradient each) per iteration; sanity checks
      # not counted. Every attack is costed on every image: an upper bound,
      # as APGD-T attacks only the images the others (and its earlier
      # targets) left robust, which no estimate knows before the run.
      st = cfg.eval.strong
      noisy = bool(cfg.model.noise_coef)
      eot = (st.eot_samples or 20) if noisy else 1
      attacks = 2 + (st.num_targets if st.targeted else 0)
      per_image = attacks * (st.num_iters + 1) * (eot + (1 if noisy else 0))
      if noisy:
        per_image *= _NOISY_EOT_COST
      return n * st.num_seeds * m * eval_iter_per_image * per_image
    total = 0.0
    for name in cfg.eval.attacks.split(","):
      if name == "nattack":
        total += (n * cfg.eval.nattack_iters * cfg.eval.nattack_population
                  * m * eval_iter_per_image * _NATTACK_QUERY_COST)
      else:
        total += n * m * eval_iter_per_image * _EVAL_ITERS[name]
    return total
  if only is not None:
    return (sum(eval_cost(_with(c, e.overrides)) for e in only)
            + (eval_cost(c) if main_eval else 0.0))
  # About a minute of compiling per ResNet20-sized program set.
  compile_seconds = 60 * m * step_times.clean_step / reference.clean_step
  total = train + eval_cost(c) + compile_seconds
  for e in run.extra_evals:
    total += eval_cost(_with(c, e.overrides))
  return total


def from_scratch_seconds(tables: Mapping[str, Iterable[str] | None],
                         scale: scales_lib.Scale, *,
                         seeds: int | None = None,
                         step_times: StepTimes = REFERENCE_STEP_TIMES,
                         step_times_of: Callable[[Run], StepTimes] | None
                         = None) -> dict[str, float]:
  """Per table (name -> its rows, None: all), the estimated seconds of its
  runs as if none had run (``seeds``: per row, default the table's),
  counting only the runs that no table before it in ``tables`` has: what
  docs/reproduction.md tabulates. Reads no file. ``step_times_of``: each
  run's step times, instead of ``step_times`` for all."""
  seen: set[str] = set()
  out = {}
  for name, rows in tables.items():
    total = 0.0
    for run in plan(tables_lib.TABLES[name], scale, rows=rows or None,
                    seeds=seeds):
      if run.key not in seen:
        seen.add(run.key)
        total += estimate_seconds(run, step_times=(
            step_times_of(run) if step_times_of else step_times))
    out[name] = total
  return out


def format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
