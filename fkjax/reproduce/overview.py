"""Every row run at a scale in one table: ``results/<scale>/overview.md``.

Read from the tables' JSON beside it (what :mod:`fkjax.reproduce.report`
writes), nothing else: a row's A1-A4 and the sparsities of the net it
evaluates, mean +- sample std over its finished seeds, the paper's number in
brackets, then its seeds, the epochs of the checkpoints it evaluated and the
machines it ran on. A row several tables report is listed once, at the table
that trains it. ADMM rows get a second line for the dense ``w``: the paper's
reading, and the one its numbers belong to. The file holds no timestamp, so
the same results always give the same text.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from fkjax.reproduce import files
from fkjax.reproduce import report
from fkjax.reproduce import runner as runner_lib
from fkjax.reproduce import scales as scales_lib

FILE = "overview.md"

# (metric key of the evaluated net, of ADMM's dense w, column header)
COLUMNS = (("A1", "w_A1", "A1"), ("A2", "w_A2", "A2"), ("A3", "w_A3", "A3"),
           ("A4", None, "A4"), ("sparsity", "w_sparsity", "weights pruned"),
           ("channel_sparsity", "w_channel_sparsity", "channels pruned"))
_SYMBOLS = {"beta": "β", "lambda1": "λ1", "lambda2": "λ2"}
_TEXT_LABELS = ("Net", "Training", "Pruning", "Method", "Type")
_SPARSIFIERS = ("rvsm", "rgsm", "admm")


def load(results_dir: str, scale: str) -> dict[str, dict[str, Any]]:
  """The tables written so far at ``scale``, in the runner's order."""
  out = {}
  for name in runner_lib.ORDER:
    data = files.load_json(os.path.join(results_dir, scale, f"{name}.json"))
    if data:
      out[name] = data
  return out


def _where(data: Mapping[str, Any]) -> str:
  """``Table 4`` from ``Table 4, Fig. 3``."""
  return data["paper_ref"].split(",")[0]


def _label(row: Mapping[str, Any]) -> str:
  """``ResNet20, RGSM, λ1 = 0.05``: the row's label columns, and its
  sparsifier where they do not name it."""
  parts = []
  for key, value in row["label"].items():
    if value == "n/a":
      continue
    parts.append(value if key in _TEXT_LABELS
                 else f"{_SYMBOLS.get(key, key)} = {value}")
  sparsifier = next((p.upper() for p in row["presets"].split(",")
                     if p in _SPARSIFIERS), None)
  if sparsifier and not any(sparsifier in p for p in parts):
    parts.insert(1, sparsifier)
  return ", ".join(parts)


def _cell(done: list[dict[str, Any]], metric: str | None,
          paper: float | None) -> str:
  values = [e["metrics"][metric] for e in done
            if metric and metric in e.get("metrics", {})]
  text = report.format_summary(report.summarize(values) if values else None)
  if paper is not None:
    text += f" ({report.format_paper(paper)})"
  return text


def _machines(done: list[dict[str, Any]]) -> str:
  """``cpu`` or, where a row's seeds ran on more than one machine, the
  seeds of each: ``cpu (seed 0), NVIDIA H200 (seeds 1, 2)``."""
  seeds: dict[str, list[str]] = {}
  for e in done:
    seeds.setdefault(report.machine_of(e), []).append(str(e["seed"]))
  if len(seeds) == 1:
    return next(iter(seeds))
  return ", ".join(f"{m} (seed{'s' if len(s) > 1 else ''} {', '.join(s)})"
                   for m, s in seeds.items())


def _epochs(done: list[dict[str, Any]]) -> str:
  """The epochs of the evaluated checkpoints: ``5, 5, 4 of 5``."""
  epochs = [e.get("checkpoint_epoch") for e in done]
  totals = {e.get("epochs") for e in done}
  if None in epochs or len(totals) != 1:
    return "—"
  return f"{', '.join(str(x) for x in epochs)} of {totals.pop()}"


def lines_of(tables: Mapping[str, Mapping[str, Any]]
             ) -> tuple[list[list[str]], list[str]]:
  """The table's rows (lists of cells) and the names of rows not yet run.

  A row is listed at the table that trains it; where that table is not
  written yet, at the first table that reports it."""
  wheres: dict[str, list[str]] = {}
  for name, data in tables.items():
    for row in data["rows"]:
      wheres.setdefault(row["shared"] or f"{name}/{row['name']}",
                        []).append(_where(data))
  lines, not_run, listed = [], [], set()
  for name, data in tables.items():
    for row in data["rows"]:
      key = row["shared"] or f"{name}/{row['name']}"
      if key in listed or (row["shared"] and
                           row["shared"].split("/")[0] in tables):
        continue
      listed.add(key)
      where = _where(data)
      label = f"{where}: {_label(row)}"
      done = [e for e in row["runs"] if e["status"] == "done"]
      if not done:
        not_run.append(label)
        continue
      also = list(dict.fromkeys(w for w in wheres[key] if w != where))
      if also:
        label += f" (also {', '.join(also)})"
      paper = row["paper"]
      dense = any("w_A1" in e.get("metrics", {}) for e in done)
      tail = [f"{len(done)}/{row['seeds']}", _epochs(done), _machines(done)]
      if dense:
        # The paper's ADMM numbers are of the dense w: they go on its line.
        lines.append([f"{label}: the projection u (fkjax's reading)"] +
                     [_cell(done, m, None) for m, _, _ in COLUMNS] + tail)
        lines.append([f"{label}: the dense w (the paper's reading)"] +
                     [_cell(done, w, paper.get(m)) for m, w, _ in COLUMNS] +
                     tail)
      else:
        lines.append([label] + [_cell(done, m, paper.get(m))
                                for m, _, _ in COLUMNS] + tail)
  return lines, not_run


def table_markdown(lines: list[list[str]]) -> str:
  """The Markdown table alone (what docs/reproduction.md shows)."""
  header = (["table: row"] + [h for _, _, h in COLUMNS] +
            ["seeds done", "checkpoint epochs", "machine"])
  out = ["| " + " | ".join(header) + " |",
         "| " + " | ".join("---" for _ in header) + " |"]
  out += ["| " + " | ".join(cells) + " |" for cells in lines]
  return "\n".join(out) + "\n"


def markdown(tables: Mapping[str, Mapping[str, Any]], scale: str) -> str:
  """``overview.md``: the table, what its columns are, the rows not run."""
  lines, not_run = lines_of(tables)
  text = [
      f"# Every row run at the `{scale}` scale",
      "",
      "From the result tables beside this file, by `python -m "
      f"fkjax.reproduce overview {scales_lib.command_flags(scale)}` (also "
      "rewritten with "
      "every table). Percentages; fkjax's mean ± sample std over the "
      "finished seeds, the paper's number in brackets where it gives one. "
      "A1 natural, A2 FGSM, A3 IFGSM^20, A4 fkjax's C&W-linf (on the "
      "test images each table's file names); weights pruned: exactly-zero conv "
      "weights, channels pruned: conv channel groups of norm < 1e-15, both "
      "of the evaluated net. A row other tables report too is listed once. "
      "Checkpoint epochs: the epoch of each seed's evaluated checkpoint.",
      "",
      table_markdown(lines).rstrip("\n"),
  ]
  if not_run:
    text += ["", "Not yet run: " + "; ".join(not_run) + "."]
  return "\n".join(text) + "\n"


def write(results_dir: str, scale: str) -> str:
  """Writes ``<results_dir>/<scale>/overview.md``; returns its path."""
  folder = os.path.join(results_dir, scale)
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, FILE)
  files.atomic_text(path, markdown(load(results_dir, scale), scale))
  return path
