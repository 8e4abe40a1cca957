"""A table's results: ``results/<scale>/<table>.json`` and ``.md``.

fkjax's numbers (mean +- sample std over the finished seeds) next to the
paper's, every run's exact commands, wall time and status; rows without a
finished run say "not yet run". Nothing here is computed from anything but
the runs' own result files.
"""
from __future__ import annotations

import datetime
import math
import os
import statistics
from typing import Any, Iterable

import ml_collections

from fkjax import atomic
from fkjax import host
from fkjax import workdir as workdir_lib
from fkjax.workdir import metric_logging
from reproduce import files
from reproduce.run import archive as archive_lib
from reproduce.run import estimate as estimate_lib
from reproduce.run import records
from reproduce.run import standing as standing_lib
from reproduce.run.runs import ExtraEvalRun, Run
from reproduce.spec import scales as scales_lib
from reproduce.spec import tables as tables_lib

NOT_RUN = "not yet run"


def summarize(values: list[float]) -> dict[str, float | int]:
  """``{"mean", "std" (sample; 0 for one value), "n"}`` of ``values``."""
  mean = statistics.fmean(values)
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return {"mean": mean, "std": std, "n": len(values)}


# Records written before they named their machine: every such run of this
# repository ran on its 2-core CPU machine.
CPU_BEFORE_DEVICES = "cpu"


def machine_of(entry: dict[str, Any]) -> str:
  """``NVIDIA H200`` from ``1 x NVIDIA H200 (gpu), jax 0.11.2``; ``cpu
  AVX2`` from ``1 x cpu (cpu), jax 0.10.2; AMD EPYC, 2 cores, AVX2`` (plain
  ``cpu`` from a record that does not name its CPU's instruction set)."""
  devices = entry.get("devices") or CPU_BEFORE_DEVICES
  kind = devices.split(" x ", 1)[-1].split(" (", 1)[0]
  isa = host.isa_of(devices)
  return f"{kind} {isa}" if isa else kind


def _wall_times(done: list[dict[str, Any]]) -> str:
  """Mean wall time per seed, by machine where a row ran on more than one."""
  by_machine: dict[str, list[float]] = {}
  for e in done:
    by_machine.setdefault(machine_of(e), []).append(e["wall_seconds"])
  cells = [estimate_lib.format_seconds(sum(t) / len(t)) +
           ("" if m == CPU_BEFORE_DEVICES else f" ({m})")
           for m, t in by_machine.items()]
  return ", ".join(cells)


def _checkpoint_epoch(record: dict[str, Any],
                      config: ml_collections.ConfigDict,
                      workdir: str) -> dict[str, Any]:
  """The epoch of the checkpoint a run was evaluated at, its number of
  epochs and, when the two differ, the sparsity its training log gives for
  the last epoch: a short schedule's best-validation checkpoint may come
  from before a sparsifier has pruned much, which its numbers then show."""
  step = record.get("checkpoint_step")
  if not step:
    return {}
  per_epoch = scales_lib.steps_per_epoch(scales_lib.train_size(config),
                                         config)
  out: dict[str, Any] = {"checkpoint_epoch": -(-step // per_epoch),
                         "epochs": config.training.num_epochs}
  if out["checkpoint_epoch"] < out["epochs"]:
    last = [r for r in metric_logging.read_metrics(workdir)
            if r.get("epoch") == out["epochs"] and "weight_sparsity" in r]
    if last:
      out["last_epoch_sparsity"] = last[-1]["weight_sparsity"]
      out["last_epoch_channel_sparsity"] = last[-1]["channel_sparsity"]
  return out


def _done_entry(run: Run, record: dict[str, Any],
                metrics: tuple[str, ...]) -> dict[str, Any]:
  """A finished run's entry, read again from the run's files: a column added
  to the tables after the run finished is filled from what its evaluation
  wrote. A pending extra evaluation's columns stay empty, whatever an older
  setting of it left. One made with older defaults (fkjax.config.history)
  is reported, its columns marked."""
  standing = standing_lib.standings(run)
  pending = [e for e in run.extra_evals
             if standing[f"eval_{e.protocol}"] is None]
  kept = record.get("fingerprints", {})
  reported = [standing_lib.kept_result(
                  run, e, kept.get(f"eval_{e.protocol}"))
              for e in run.extra_evals if e not in pending]
  stale = {c for e in pending for c in e.columns}
  main = records.main_eval(run)
  if standing["eval"] is None:
    # Its main evaluation ran with other settings: none of its
    # columns are reported until it runs again.
    main = {}
    stale |= set(records.MAIN_EVAL_COLUMNS) - {
        c for e in reported for c in e.columns}
  values = {k: v for k, v in {
      **record.get("metrics", {}), **records.metrics_of(
          run.workdir, run.eval_result, reported, main)}.items()
            if k not in stale}
  older = {stage: list(o) for stage, o in standing.items() if o}
  return {**record, "metrics": values, "status": "done",
          "pending": (["eval"] if standing["eval"] is None
                      else []) + [f"eval_{e.protocol}" for e in pending],
          "older_settings": older,
          "older_columns": _older_columns(older, run.extra_evals, metrics),
          "correct_per_image": records.correct_per_image_of(main),
          **_checkpoint_epoch(record, run.config, run.workdir)}


def _entry(run: Run, metrics: tuple[str, ...]) -> dict[str, Any]:
  """A run's entry: its results when finished, else its status, commands
  and estimated time."""
  record = files.load_json(os.path.join(run.workdir, archive_lib.RUN_RECORD),
                           files.RUN_RECORD)
  if record and standing_lib.finished(run):
    return _done_entry(run, record, metrics)
  return {
      "seed": run.seed, "workdir": run.workdir,
      "status": standing_lib.status_of(run),
      "commands": records.commands_of(run),
      "estimated_seconds_2_idle_cores":
          round(estimate_lib.estimate_seconds(run)),
  }


def _row(row: tables_lib.Row, runs: list[Run],
         metrics: tuple[str, ...]) -> dict[str, Any]:
  """One row of the table from its runs: their entries and the summary of
  the finished ones."""
  entries = [_entry(run, metrics) for run in runs]
  done = [e for e in entries if e["status"] == "done"]
  older: dict[str, list[str]] = {}
  for e in done:
    for metric, notes in e["older_columns"].items():
      older[metric] = sorted(set(older.get(metric, [])) | set(notes))
  summary = {}
  for metric in metrics:
    values = [e["metrics"][metric] for e in done
              if metric in e.get("metrics", {})]
    if values:
      summary[metric] = summarize(values)
  return {
      "name": row.name,
      "label": dict(row.label),
      "presets": row.presets,
      "overrides": dict(row.overrides),
      "shared": row.shared,
      "paper": {k: v for k, v in row.paper.items() if v is not None},
      "seeds": len(entries),
      "runs": entries,
      "summary": summary,
      # metric -> the older defaults some of its finished runs were made
      # with (fkjax.config.history): the table marks those cells
      "older": {m: notes for m, notes in older.items() if m in summary},
  }


def collect(table: tables_lib.Table, scale: scales_lib.Scale,
            runs: Iterable[Run]) -> dict[str, Any]:
  """The results of ``table`` from its runs' workdirs, as JSON data."""
  runs = list(runs)
  by_row: dict[str, list[Run]] = {}
  for run in runs:
    by_row.setdefault(run.row.name, []).append(run)
  rows = [_row(row, by_row[row.name], table.metrics)
          for row in table.rows if row.name in by_row]
  example = runs[0].config if runs else None
  version = workdir_lib.source_version(package_only=True)
  return {
      "table": table.name,
      "title": table.title,
      "paper_ref": table.paper_ref,
      "scale": scale.name,
      "scale_description": scale.description,
      "scale_overrides": {k: list(v) if isinstance(v, tuple) else v
                          for k, v in scale.overrides.items()},
      "decay_multiplier": scale.decay_multiplier,
      "shrinkage_factor": (scales_lib.shrinkage_factor(example)
                           if example is not None else None),
      "metrics": {m: tables_lib.METRICS[m] for m in table.metrics},
      "notes": list(table.notes),
      "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
      # The tables are computed by the package alone (results/ and docs/
      # being rewritten do not make it another program).
      **{k: version[k] for k in ("git_commit", "git_dirty")},
      "rows": rows,
  }


def _older_columns(older: dict[str, list[str]],
                   extra_evals: Iterable[ExtraEvalRun],
                   metrics: Iterable[str]) -> dict[str, list[str]]:
  """Metric -> the older defaults its value was made with, from the stages
  made so (``older``): an extra evaluation's columns, the main
  evaluation's (all others), or every column for the training."""
  extra_columns = {f"eval_{e.protocol}": e.columns for e in extra_evals}
  theirs = {c for cs in extra_columns.values() for c in cs}
  out: dict[str, list[str]] = {}
  for stage, notes in older.items():
    if stage == "train":
      columns = list(metrics)
    elif stage == "eval":
      columns = [m for m in metrics if m not in theirs]
    else:
      columns = list(extra_columns.get(stage, ()))
    for column in columns:
      out[column] = sorted(set(out.get(column, [])) | set(notes))
  return out


def format_summary(summary: dict[str, Any] | None) -> str:
  """``52.27 ± 0.78`` (one value: ``52.27``; none: ``—``)."""
  if not summary:
    return "—"
  if summary["n"] > 1:
    return f"{summary['mean']:.2f} ± {summary['std']:.2f}"
  return f"{summary['mean']:.2f}"


def format_paper(value: float | None) -> str:
  """A number of the paper, ``—`` where it gives none."""
  return "—" if value is None or (isinstance(value, float)
                                  and math.isnan(value)) else f"{value:.2f}"


def _intro(data: dict[str, Any], header: list[str]) -> list[str]:
  """The title, the scale, how to read the numbers and the table's head."""
  lines = [
      f"# {data['paper_ref']}: {data['title']}",
      "",
      f"Scale **{data['scale']}**: {data['scale_description']}.",
  ]
  if data.get("decay_multiplier") not in (None, 1, 1.0):
    lines.append(
        f"Weight decay (and lambda2, ADMM's rho) x "
        f"{data['decay_multiplier']}, pruning thresholds x "
        f"{data['decay_multiplier']}^-1/4 (the paper's schedule has "
        f"{data['shrinkage_factor']:.1f}x this one's sum of learning rates; "
        "docs/reproduction.md).")
  lines += [
      "",
      "fkjax: mean ± sample std over the finished seeds; paper: the "
      "paper's number (— where it gives none). Percentages. Wall time: "
      "per seed, on a CPU unless a GPU is named (jobs that shared one GPU "
      "each count their own wall time).",
      "",
      "| " + " | ".join(header) + " |",
      "|" + "|".join("---" for _ in header) + "|",
  ]
  return lines


def _older_marks(rows: list[dict[str, Any]],
                 metrics: list[str]) -> dict[str, str]:
  """Older default -> the mark of the cells made with it
  (fkjax.config.history), in order of first use."""
  marks: dict[str, str] = {}
  for r in rows:
    for m in metrics:
      for note in r.get("older", {}).get(m, ()):
        marks.setdefault(note, _MARKS[len(marks) % len(_MARKS)]
                         * (1 + len(marks) // len(_MARKS)))
  return marks


def _table_line(r: dict[str, Any], labels: list[str], metrics: list[str],
                marks: dict[str, str]) -> str:
  """One row of the table: its labels, fkjax's and the paper's numbers,
  seeds done and wall time."""
  done = [e for e in r["runs"] if e["status"] == "done"]
  cells = [r["label"].get(k, "") for k in labels]
  for m in metrics:
    mark = "".join(marks[n] for n in r.get("older", {}).get(m, ()))
    cells.append(format_summary(r["summary"].get(m)) + mark if done
                 else NOT_RUN)
    cells.append(format_paper(r["paper"].get(m)))
  cells.append(f"{len(done)}/{r['seeds']}")
  if done:
    cells.append(_wall_times(done))
  else:
    cells.append("—")
  return "| " + " | ".join(cells) + " |"


def _run_lines(r: dict[str, Any], e: dict[str, Any]) -> list[str]:
  """One run of a row: its status, wall time, checkpoint, workdir and
  commands."""
  status = e["status"]
  if e.get("pending"):
    status += f" ({', '.join(e['pending'])} not yet run)"
  for stage, notes in e.get("older_settings", {}).items():
    status += f" ({stage} made with {', '.join(notes)})"
  wall = (f", {estimate_lib.format_seconds(e['wall_seconds'])} on "
          f"{e.get('devices') or CPU_BEFORE_DEVICES}"
          if e["status"] == "done" else "")
  if e.get("checkpoint_epoch"):
    wall += (f", checkpoint of epoch {e['checkpoint_epoch']}/"
             f"{e['epochs']}")
    if e.get("last_epoch_sparsity") or e.get(
        "last_epoch_channel_sparsity"):
      wall += (f" (at epoch {e['epochs']}: "
               f"{e['last_epoch_sparsity']:.2f}% of weights and "
               f"{e['last_epoch_channel_sparsity']:.2f}% of channels "
               "pruned)")
  shared = f" (trained for {r['shared']})" if r["shared"] else ""
  lines = [f"- `{r['name']}` seed {e['seed']}: {status}{wall}"
           f"{shared}, `{e['workdir']}`"]
  for name, cmd in e["commands"].items():
    lines.append(f"  - {name}: `{cmd}`")
  return lines


def markdown(data: dict[str, Any]) -> str:
  """The results as Markdown: fkjax's column, then the paper's."""
  rows = data["rows"]
  metrics = [m for m in data["metrics"]
             if any(m in r["summary"] or m in r["paper"] for r in rows)]
  labels: list[str] = []
  for r in rows:
    for key in r["label"]:
      if key not in labels:
        labels.append(key)
  header = labels + [h for m in metrics
                     for h in (data["metrics"][m], "paper")]
  header += ["seeds done", "wall time / seed"]
  lines = _intro(data, header)
  # Cells made with older defaults: a mark each, said under the table.
  marks = _older_marks(rows, metrics)
  lines += [_table_line(r, labels, metrics, marks) for r in rows]
  for note, mark in marks.items():
    lines += ["", f"{mark} made with {note}: kept as it ran; a run with a "
              "checkpoint in its workdir runs it again with the setting of "
              "now."]
  lines += ["", "Columns:"]
  for m in metrics:
    lines.append(f"- {data['metrics'][m]}: {_COLUMN_DOC[m]}")
  if data["notes"]:
    lines += ["", "Notes:"] + [f"- {n}" for n in data["notes"]]
  lines += ["", "## Runs", ""]
  for r in rows:
    for e in r["runs"]:
      lines += _run_lines(r, e)
  lines += ["", f"Generated {data['generated']} from fkjax "
            f"{data['git_commit'] or '(unknown commit)'}"
            f"{' with uncommitted changes' if data.get('git_dirty') else ''}"
            " by "
            f"`python -m reproduce {data['table']} "
            f"{scales_lib.command_flags(data['scale'])}`.", ""]
  return "\n".join(lines)


# The marks of cells made with older defaults, in order of first use.
_MARKS = ("†", "‡", "§", "¶")

_COLUMN_DOC = {
    "A1": "accuracy on clean test images",
    "A2": "under FGSM (eps 8/255)",
    "A3": "under IFGSM^20 (eps 8/255, step 2/255, from x)",
    "A4": ("under fkjax's C&W-linf: 20 PGD steps on the C&W margin loss "
           "within eps 8/255"),
    "A4_authors": ("under the C&W variant of the authors' code (50 Adam "
                   "steps, perturbation scaled by 0.031), which explains the "
                   "paper's A4 above A2"),
    "A5": "under NAttack (gradient-free)",
    "A_strong": ("fkjax's strong protocol, not in the paper: robust to "
                 "APGD-CE and APGD-DLR together (EOT over the noise); see "
                 "the notes for its size at this scale"),
    "sparsity": "% exactly-zero conv weights of the evaluated weights u",
    "channel_sparsity": ("% conv channel groups (input channels) of norm "
                         "< 1e-15 in u"),
    "small_share": "% conv weights with |w| < 1e-3 (trained weights)",
    "w_A1": ("ADMM: A1 of the trained dense w (the paper's reading; fkjax "
             "evaluates the projection u)"),
    "w_A2": "ADMM: A2 of the dense w",
    "w_A3": "ADMM: A3 of the dense w",
    "w_sparsity": "% exactly-zero conv weights of the trained (dense) w",
    "w_channel_sparsity": "% channels of norm < 1e-15 in w",
    "w_small_share": "% conv weights of w with |w| < 1e-3",
    "w_small_channel_share": "% channels of w with norm < 1e-3",
}


def write(data: dict[str, Any], results_dir: str) -> tuple[str, str]:
  """Writes ``<results_dir>/<scale>/<table>.json`` and ``.md``."""
  folder = os.path.join(results_dir, data["scale"])
  os.makedirs(folder, exist_ok=True)
  json_path = os.path.join(folder, f"{data['table']}.json")
  md_path = os.path.join(folder, f"{data['table']}.md")
  atomic.write_json(json_path, data)
  atomic.write_text(md_path, markdown(data))
  return json_path, md_path
