"""Runs the stages of one run that are not done, and records it.

Each (row, seed) is a *run* in its own workdir, ``<root>/<scale>/<table>/
<row>_seed<k>`` (a row shared with another table runs in that table's
workdir). A run goes through stages, each skipped when its result exists:

1. ``train``: ``fkjax.training.train.train_and_evaluate`` (resumes from the
   last checkpoint after a kill; ends with train.py's own
   ``final_eval.json``);
2. ``eval``: ``fkjax.evaluation.run.evaluate_checkpoint``
   (``eval_paper.json``);
3. one stage per extra evaluation of the table (``eval_<protocol>.json``);
4. ``analysis``: weight statistics (:mod:`reproduce.analysis`);
5. ``publish`` (scales that publish weights): the evaluated weights,
   ``weights.npz`` (:mod:`reproduce.run.weights`).

Then ``reproduce_run.json`` records the run: the exact equivalent
``train.py`` / ``eval.py`` commands, the wall time of each stage (kept across
kills to within :data:`reproduce.run.progress.HEARTBEAT_SECONDS`) and the
metrics (:mod:`reproduce.run.records`). After every run
the table is rewritten (``results/<scale>/<table>.json`` and ``.md``, and its
figures), so a killed runner leaves a table of the runs finished so far.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import jax
import ml_collections

from fkjax import atomic
from fkjax import workdir as workdir_lib
from fkjax.config import record as run_config
from fkjax.evaluation import run as eval_run
from fkjax.training import build
from fkjax.training import devices
from fkjax.training import train
from reproduce import analysis
from fkjax.workdir.results import RESULT_SHAPE
from reproduce import files
from reproduce.run import archive as archive_lib
from reproduce.run import progress as progress_lib
from reproduce.run import records
from reproduce.run import runs as runs_lib
from reproduce.run import standing as standing_lib
from reproduce.run import weights as weights_lib
from reproduce.run.runs import Run


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


def execute(run: Run, *, show_progress: bool = True,
            extra_evals: bool = True) -> dict[str, Any]:
  """Runs the stages of ``run`` that are not done; returns its record.

  ``show_progress``: progress output (a bar on a terminal, else a plain line
  every 30 s, see :func:`fkjax.workdir.metric_logging.progress`).
  ``extra_evals``: False leaves the extra evaluations not yet done pending
  (:func:`reproduce.run.standing.pending_evals`): the run is finished and
  reported without their columns, and a later call with True runs them
  alone.
  """
  config = runs_lib.with_overrides(run.config, {"progress": show_progress})
  check_workdir(run)
  os.makedirs(run.workdir, exist_ok=True)
  progress = progress_lib.Progress(run.workdir)
  progress.data.pop("error", None)
  devices.enable_compilation_cache(config)
  fps = standing_lib.fingerprints(run)
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
    cfg = runs_lib.with_overrides(config, extra.overrides)
    fp = fps[stage]
    # One made with older defaults (fkjax.config.history) runs again: its
    # file, named by those settings, stays.
    path = workdir_lib.existing_eval_result(run.workdir, cfg)
    now = standing_lib.stage_standing(run, stage, progress.kept().get(stage))
    if not (now == () and path and files.load_json(path, RESULT_SHAPE)):
      progress_lib.log(
          f"{what}: extra evaluation {extra.protocol} "
          f"({extra.attacks}, {cfg.eval.num_examples or 'all'} images)")
      progress.timed(stage, fp, lambda cfg=cfg: eval_run.evaluate_checkpoint(
          cfg, run.workdir, exp=exp()))
      record = _save_record(run, progress)
  exp_cache.clear()
  jax.clear_caches()
  return record


def _core_stages(run: Run, config: ml_collections.ConfigDict,
                 progress: progress_lib.Progress, fps: Mapping[str, str],
                 exp: Callable[[], Any], what: str) -> None:
  """Trains, evaluates (A1-A4), analyses and publishes ``run``: each stage
  not done with its current fingerprint."""
  train_fp, eval_fp = fps["train"], fps["eval"]
  kept = progress.kept()

  def standing_of(settings: str, stage: str) -> standing_lib.Standing:
    # Where ``stage``, done with the fingerprint kept for it, stands by the
    # settings of ``settings`` (the analysis and the published weights are
    # those of the main evaluation).
    return standing_lib.stage_standing(run, settings, kept.get(stage))

  # A training made with older defaults (fkjax.config.history) is never
  # run again; an evaluation is, where it can be.
  if not (standing_of("train", "train") is not None
          and standing_lib.train_done(run)):
    progress_lib.log(f"{what}: training in {run.workdir}")
    progress.timed("train", train_fp,
                   lambda: train.train_and_evaluate(config, run.workdir))
  if not (standing_of("eval", "eval") == ()
          and files.load_json(standing_lib.main_result_path(run),
                              RESULT_SHAPE)):
    progress_lib.log(f"{what}: evaluating ({config.eval.attacks})")
    progress.timed("eval", eval_fp, lambda: eval_run.evaluate_checkpoint(
        config, run.workdir, exp=exp()))
  # The analysis and the published weights are of the evaluated checkpoint.
  apath = os.path.join(run.workdir, analysis.ANALYSIS_JSON)
  if not (standing_of("eval", "analysis") is not None
          and files.load_json(apath, files.ANALYSIS)):
    progress.timed("analysis", eval_fp,
                   lambda: analysis.analyze_run(config, run.workdir,
                                                exp=exp()))
  wpath = os.path.join(run.workdir, weights_lib.WEIGHTS_FILE)
  if run.publish and not (
      standing_of("eval", "publish") is not None
      and os.path.exists(wpath)):
    progress.timed("publish", eval_fp,
                   lambda: weights_lib.publish(config, run.workdir, exp=exp()))


def _save_record(run: Run, progress: progress_lib.Progress) -> dict[str, Any]:
  """Writes the run's record, then its copy under ``results/``."""
  record = records.make_record(run, progress)
  atomic.write_json(os.path.join(run.workdir, archive_lib.RUN_RECORD), record)
  if run.archive is not None:
    archive_lib.save(run.workdir, run.archive)
  return record


def record_failure(run: Run, error: BaseException) -> None:
  """Notes in the run's progress file that its last attempt failed."""
  progress = progress_lib.Progress(run.workdir)
  progress.data["error"] = f"{type(error).__name__}: {error}"
  progress.save()
