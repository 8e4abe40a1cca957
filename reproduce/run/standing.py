"""Where each stage of a run stands against the settings of now: the
fingerprints of its settings, the settings its finished stages were
recorded with, and the status a dry run and a table show."""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from typing import Any, Mapping, Optional, Tuple

import ml_collections

from configs import default as default_config
from fkjax.config import history
from fkjax.config import record as run_config
from fkjax.evaluation import journal as eval_journal
from fkjax.training import precision
from fkjax import workdir as workdir_lib
from fkjax.workdir import metric_logging
from fkjax.workdir.results import RESULT_SHAPE
from reproduce import files
from reproduce.run import archive as archive_lib
from reproduce.run import runs as runs_lib
from reproduce.run.runs import ExtraEvalRun, Run



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


def fingerprints(run: Run) -> dict[str, str]:
  """Per stage, a hash of the settings that change what it computes."""
  saved = run_config.load_saved(run.workdir)
  keys = set(run_config.flatten(saved)) if saved is not None else None
  out = {"train": _fingerprint(_computed(run.config, False, keys)),
         "eval": _fingerprint(_computed(run.config, True, keys))}
  for extra in run.extra_evals:
    out[f"eval_{extra.protocol}"] = _fingerprint(_computed(
        runs_lib.with_overrides(run.config, extra.overrides), True, keys))
  return out


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
  return runs_lib.with_overrides(run.config, extra.overrides)


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
      data = files.load_json(path, RESULT_SHAPE) or {}
      candidates.append((data.get("metadata", {}).get("config"), path))
  for settings, path in candidates:
    if isinstance(settings, dict) and _fingerprint(
        _computed(settings, with_eval)) == fingerprint:
      return settings, path
  return None


def stage_standing(run: Run, stage: str, fingerprint: str | None,
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
  if key == "precision":
    # "auto" as this platform resolves it, as the runs' configs are.
    return precision.name_of(ml_collections.ConfigDict({key: value}))
  return list(value) if isinstance(value, tuple) else value


def standings(run: Run, kept: Mapping[str, str] | None = None
              ) -> dict[str, Standing]:
  """Per stage (``train``, ``eval``, ``eval_<protocol>``), where it stands
  by the fingerprints ``kept`` (default: the finished run's record's)."""
  if kept is None:
    record = files.load_json(
        os.path.join(run.workdir, archive_lib.RUN_RECORD),
        files.RUN_RECORD) or {}
    kept = record.get("fingerprints", {}) if record.get("done") else {}
  return {stage: stage_standing(run, stage, kept.get(stage), now)
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


def main_result_path(run: Run) -> str:
  """The main evaluation's result file (:func:`fkjax.workdir.
  existing_eval_result`: perhaps named before subsets said ``_n<N>``)."""
  return (workdir_lib.existing_eval_result(run.workdir, run.config)
          or os.path.join(run.workdir, run.eval_result))


def train_done(run: Run) -> bool:
  """Whether its training has run to its last epoch (and its final
  evaluation, where it has one)."""
  if run.config.eval.final_attacks:
    path = os.path.join(run.workdir, "final_eval.json")
    return files.load_json(path, RESULT_SHAPE) is not None
  epochs = [r.get("epoch") for r in metric_logging.read_metrics(run.workdir)]
  return run.config.training.num_epochs in epochs


def _trained(run: Run, record: Mapping[str, Any] | None) -> bool:
  if not (record and record.get("done")):
    return False
  kept = record.get("fingerprints", {}).get("train")
  return stage_standing(run, "train", kept) is not None


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
  return _trained(run, files.load_json(
      os.path.join(run.workdir, archive_lib.RUN_RECORD), files.RUN_RECORD))


def has_checkpoint(run: Run) -> bool:
  """Whether the workdir holds checkpoints (a run restored from results/
  does not: an evaluation it lacks cannot be run without training it)."""
  directory = os.path.join(run.workdir, "checkpoints")
  return os.path.isdir(directory) and bool(os.listdir(directory))


def status_of(run: Run) -> str:
  """``done``, ``done, eval_<protocol> not yet run``, ``to update``,
  ``failed: ...``, ``trained i/n epochs`` (with ``, evaluating (k batches
  done)`` where a killed evaluation kept some) or ``not started``."""
  record = files.load_json(os.path.join(run.workdir, archive_lib.RUN_RECORD),
                           files.RUN_RECORD)
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
  progress = files.load_json(
      os.path.join(run.workdir, archive_lib.PROGRESS_FILE),
      files.PROGRESS) or {}
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
  return max((r.get("epoch", 0) for r in metric_logging.read_metrics(
      run.workdir)), default=0)


def status_view(run: Run) -> Run:
  """``run`` as its files say where it stands: its workdir, or where that
  is empty and a finished copy is kept under ``results/``, that copy
  (read only; it has no checkpoints)."""
  if (run.archive is not None and archive_lib.is_empty(run.workdir)
      and files.load_json(os.path.join(run.archive, archive_lib.RUN_RECORD),
                          files.RUN_RECORD)):
    return dataclasses.replace(run, workdir=run.archive)
  return run
