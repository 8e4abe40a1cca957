"""Every row run at a scale in one table: ``results/<scale>/overview.md``.

Read from the tables' JSON beside it (what :mod:`reproduce.report.report`
writes), nothing else: a row's A1-A4 and the sparsities of the net it
evaluates, mean +- sample std over its finished seeds, the paper's number in
brackets, then its seeds, the epochs of the checkpoints it evaluated and the
machines it ran on. A row several tables report is listed once, at the table
that trains it. ADMM rows get a second line for the dense ``w``: the paper's
reading, and the one its numbers belong to. The file holds no timestamp, so
the same results always give the same text. Beside it, ``overview.png``
(:func:`figure`) plots every row's numbers against the paper's.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

# matplotlib.figure.Figure, not pyplot: no backend chosen, no global state.
from matplotlib.figure import Figure
import numpy as np

from fkjax import atomic
from reproduce import files
from reproduce.report import figures
from reproduce.report import report
from reproduce.spec import scales as scales_lib
from reproduce.spec import tables as tables_lib

FILE = "overview.md"
PLOT_FILE = "overview.png"

# (metric key of the evaluated net, of ADMM's dense w, column header)
COLUMNS = (("A1", "w_A1", "A1"), ("A2", "w_A2", "A2"), ("A3", "w_A3", "A3"),
           ("A4", None, "A4"), ("sparsity", "w_sparsity", "weights pruned"),
           ("channel_sparsity", "w_channel_sparsity", "channels pruned"))
_SYMBOLS = {"beta": "β", "lambda1": "λ1", "lambda2": "λ2"}
_TEXT_LABELS = ("Net", "Training", "Pruning", "Method", "Type")
_SPARSIFIERS = ("rvsm", "rgsm", "admm")
# The figure's panels: (metric key, of ADMM's dense w, title).
PLOT_METRICS = (("A1", "w_A1", "A1 natural"), ("A3", "w_A3", "A3 IFGSM^20"),
                ("sparsity", "w_sparsity", "weights pruned"),
                ("channel_sparsity", "w_channel_sparsity",
                 "channels pruned"))
_SPARSITIES = ("sparsity", "channel_sparsity")


def load(results_dir: str, scale: str) -> dict[str, dict[str, Any]]:
  """The tables written so far at ``scale``, in the runner's order."""
  out = {}
  for name in tables_lib.ORDER:
    data = files.load_json(os.path.join(results_dir, scale, f"{name}.json"),
                           files.TABLE)
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


def _listed_rows(tables: Mapping[str, Mapping[str, Any]]):
  """``(label, row, done runs)`` of each row once, at the table that trains
  it (where that table is not written yet, at the first table reporting
  it); ``done`` is empty for a row not run yet, whose label is bare."""
  wheres: dict[str, list[str]] = {}
  for name, data in tables.items():
    for row in data["rows"]:
      wheres.setdefault(row["shared"] or f"{name}/{row['name']}",
                        []).append(_where(data))
  listed = set()
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
      also = list(dict.fromkeys(w for w in wheres[key] if w != where))
      if done and also:
        label += f" (also {', '.join(also)})"
      yield label, row, done


def _has_dense(done: list[dict[str, Any]]) -> bool:
  """Whether the runs are ADMM's, with a dense ``w`` beside ``u``."""
  return any("w_A1" in e.get("metrics", {}) for e in done)


def lines_of(tables: Mapping[str, Mapping[str, Any]]
             ) -> tuple[list[list[str]], list[str]]:
  """The table's rows (lists of cells) and the names of rows not yet run.

  A row is listed at the table that trains it; where that table is not
  written yet, at the first table that reports it."""
  lines, not_run = [], []
  for label, row, done in _listed_rows(tables):
    if not done:
      not_run.append(label)
      continue
    paper = row["paper"]
    tail = [f"{len(done)}/{row['seeds']}", _epochs(done), _machines(done)]
    if _has_dense(done):
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


def rank_correlation(x: list[float], y: list[float]) -> float | None:
  """Spearman's rho (tied values share their mean rank); None for fewer
  than 3 points or where either side is constant."""
  if len(x) < 3:
    return None
  rx, ry = _ranks(x), _ranks(y)
  if np.ptp(rx) == 0 or np.ptp(ry) == 0:
    return None
  return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: list[float]) -> np.ndarray:
  values = np.asarray(values, dtype=float)
  ranks = np.empty(len(values))
  ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
  for v in np.unique(values):
    ranks[values == v] = ranks[values == v].mean()
  return ranks


def points_of(tables: Mapping[str, Mapping[str, Any]]
              ) -> dict[str, list[dict[str, Any]]]:
  """Per metric of :data:`PLOT_METRICS`, the rows that have both the paper's
  number and fkjax's: ``{"where", "label", "paper", "mean", "std",
  "seeds", "values"}`` (``values``: each seed's). ADMM rows give their
  dense ``w``'s numbers, the reading the paper's belong to; the sparsities
  leave out rows with no sparsifier (0 on both sides by construction, they
  would only inflate the correlation)."""
  out: dict[str, list[dict[str, Any]]] = {m: [] for m, _, _ in PLOT_METRICS}
  for label, row, done in _listed_rows(tables):
    pruned = any(p in _SPARSIFIERS for p in row["presets"].split(","))
    for metric, dense_key, _ in PLOT_METRICS:
      paper = row["paper"].get(metric)
      if paper is None or not done or (metric in _SPARSITIES
                                       and not pruned):
        continue
      key = dense_key if _has_dense(done) else metric
      values = [e["metrics"][key] for e in done
                if key in e.get("metrics", {})]
      if not values:
        continue
      out[metric].append({
          "where": label.split(":")[0], "label": label, "paper": paper,
          "mean": float(np.mean(values)),
          "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
          "seeds": len(values), "values": [float(v) for v in values]})
  return out


def figure(tables: Mapping[str, Mapping[str, Any]], scale: str,
           path: str) -> str | None:
  """``overview.png``: fkjax's number against the paper's (the seeds' mean,
  each seed a small hollow dot above or below it), a panel per metric of
  :data:`PLOT_METRICS`, a colour per table, with the diagonal and
  Spearman's rho of the means over all rows (the title) and within each
  table (the legend).

  A scaled protocol moves every number; what the figure asks is whether
  the rows keep the paper's order. Returns ``path``, or None (nothing
  written) when no row has both numbers yet."""
  fig = overview_figure(tables, scale)
  if fig is None:
    return None
  fig.savefig(path, dpi=110)
  return path


def overview_figure(tables: Mapping[str, Mapping[str, Any]], scale: str
                    ) -> Figure | None:
  """The figure :func:`figure` saves, or None when no row has both
  numbers."""
  points = points_of(tables)
  if not any(points.values()):
    return None
  wheres = list(dict.fromkeys(p["where"] for ps in points.values()
                              for p in ps))
  colours = {w: f"C{i % 10}" for i, w in enumerate(wheres)}
  fig = Figure(figsize=(4.2 * len(PLOT_METRICS), 5.4))
  axes = fig.subplots(1, len(PLOT_METRICS))
  for ax, (metric, _, title) in zip(axes, PLOT_METRICS):
    ps = points[metric]
    for where in wheres:
      mine = [p for p in ps if p["where"] == where]
      if not mine:
        continue
      xs, ys = [p["paper"] for p in mine], [p["mean"] for p in mine]
      # The paper compares rows within a table: its own rho says whether
      # they keep their order there.
      rho = rank_correlation(xs, ys)
      ax.plot(xs, ys, "o", color=colours[where], alpha=0.8,
              label=f"{where}: {_rows(len(mine))}"
              + (f", rho {rho:.2f}" if rho is not None else ""))
      # With 1-3 seeds the values say more than a standard deviation would.
      ax.scatter([p["paper"] for p in mine for _ in p["values"]],
                 [v for p in mine for v in p["values"]],
                 edgecolors=colours[where], **figures.SEED_DOTS)
    rho = rank_correlation([p["paper"] for p in ps], [p["mean"] for p in ps])
    low = min([0.0] + [min(p["paper"], *p["values"]) for p in ps])
    high = max([1.0] + [max(p["paper"], *p["values"]) for p in ps])
    ax.plot([low, high], [low, high], color="grey", linestyle=":",
            linewidth=1, label="fkjax = paper")
    ax.set_xlabel("the paper (%)")
    ax.set_ylabel(f"fkjax, {scale} scale (%)")
    ax.set_title(f"{title}: {_rows(len(ps))}, Spearman rho "
                 + (f"{rho:.2f}" if rho is not None else "n/a")
                 + " (all tables)", fontsize=9)
    if ps:
      # Below the panel: inside, "best" still hid points (a seed at 0%).
      ax.legend(fontsize=7, loc="upper center", ncols=2,
                bbox_to_anchor=(0.5, -0.16))
  fig.tight_layout()
  return fig


def _rows(n: int) -> str:
  return f"{n} row" + ("" if n == 1 else "s")


def table_markdown(lines: list[list[str]]) -> str:
  """The Markdown table alone (the head of overview.md)."""
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
      f"reproduce overview {scales_lib.command_flags(scale)}` (also "
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
  tables = load(results_dir, scale)
  atomic.write_text(path, markdown(tables, scale))
  figure(tables, scale, os.path.join(folder, PLOT_FILE))
  return path
