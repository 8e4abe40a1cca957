"""A finished run's record (``reproduce_run.json``): its commands, the time
of each stage, the fingerprints it was done with and the metric columns
read from its result files."""
from __future__ import annotations

import os
import shlex
from typing import Any, Iterable, Mapping

from fkjax.workdir.results import RESULT_SHAPE
from reproduce import files
from reproduce.run import progress as progress_lib
from reproduce.run import standing as standing_lib
from reproduce.run.runs import ExtraEvalRun, Run
from reproduce.spec import tables as tables_lib


def main_eval(run: Run) -> dict[str, Any]:
  """A run's main evaluation result (``{}`` where it has none)."""
  return files.load_json(standing_lib.main_result_path(run),
                         RESULT_SHAPE) or {}


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
    main = files.load_json(os.path.join(workdir, eval_result),
                           RESULT_SHAPE) or {}
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
    data = files.load_json(os.path.join(workdir, e.result_file),
                           RESULT_SHAPE) or {}
    # The main evaluation's column wins over an extra one of the same attack.
    for column, value in e.read(data).items():
      out.setdefault(column, value)
  stats = files.load_json(os.path.join(workdir, "analysis.json"),
                         files.ANALYSIS)
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


def make_record(run: Run, progress: progress_lib.Progress) -> dict[str, Any]:
  """The record of ``run`` whose stages ``progress`` accounts."""
  stages = progress.data.get("stages", {})
  # Each stage's fingerprint as it was done (with older defaults, perhaps);
  # an extra evaluation not run (execute's extra_evals=False) has none in
  # the record: standing.pending_evals names it.
  kept = progress.kept()
  done = {k: kept[k] for k in standing_lib.fingerprints(run)
          if standing_lib.stage_standing(run, k, kept.get(k)) is not None}
  extras = [standing_lib.kept_result(run, e, done[f"eval_{e.protocol}"])
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
      # runs its training stage shared (fkjax.training.sweep, --sweep); 1:
      # alone
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
