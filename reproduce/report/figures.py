"""The paper's figures, drawn from the runs' ``analysis.npz`` and results.

* ``weight_histograms`` (Figs. 1, 2c-d): conv weights of each row, log
  counts, with the share of |w| < 1e-3.
* ``filters`` (Fig. 2a-b, appendix Figs. 6-7): the same 64x64 3x3 layer of
  each adversarially trained net (member 0 of an ensemble).
* ``channel_norms`` (Fig. 3): channel-norm histograms and a zoom near zero;
  ADMM rows show the dense ``w`` and the projection ``u``.
* ``lambda_sweep`` (Figs. 4-5): channel sparsity and A1-A4 against lambda1.
* ``beta_sweep`` (Table 1, not a figure of the paper): weight sparsity and
  A1-A4 against RVSM's beta.

The sweeps draw each seed's value beside the seeds' mean, and the paper's
sparsities beside fkjax's.

Each figure uses the runs that exist (seed 0 for histograms and filters) and
is skipped when there are none.
"""
from __future__ import annotations

import os
from typing import Any

# matplotlib.figure.Figure, not pyplot: it draws PNGs without choosing a
# backend, so importing this module changes no global matplotlib state.
from matplotlib import transforms
from matplotlib.figure import Figure
import numpy as np

from fkjax.workdir import metric_logging
from reproduce import files
from reproduce.run import archive as archive_lib
from reproduce.run.runs import Run

# Every figure draws a run's single seeds alike: small open circles in the
# colour of the row's mean, so the mean stays the eye's first reading.
SEED_DOTS = dict(s=10, facecolors="none", linewidths=0.8, alpha=0.8)


def _npz(run: Run) -> dict[str, np.ndarray] | None:
  path = os.path.join(run.workdir, "analysis.npz")
  record = os.path.join(run.workdir, archive_lib.RUN_RECORD)
  if not (os.path.exists(path) and os.path.exists(record)):
    return None
  with np.load(path) as f:
    return dict(f)


def _first_seed(runs: list[Run]) -> dict[str, Run]:
  out: dict[str, Run] = {}
  for run in sorted(runs, key=lambda r: r.seed):
    if run.row.name not in out and _npz(run) is not None:
      out[run.row.name] = run
  return out


def _title(run: Run) -> str:
  return ", ".join(run.row.label.values()) or run.row.name


def weight_histograms(runs: list[Run], path: str) -> str | None:
  chosen = _first_seed(runs)
  if not chosen:
    return None
  n = len(chosen)
  fig = Figure(figsize=(4 * n, 3.2))
  axes = fig.subplots(1, n, squeeze=False)
  for ax, run in zip(axes[0], chosen.values()):
    data = _npz(run)
    edges, counts = data["weight_bins"], data["w_weight_hist"]
    ax.stairs(counts, edges, fill=True)
    ax.set_yscale("log")
    ax.set_xlim(-0.3, 0.3)
    stats = files.load_json(
        os.path.join(run.workdir, "analysis.json"), files.ANALYSIS) or {}
    share = stats.get("w", {}).get("small_share")
    ax.set_title(f"{_title(run)}\n|w|<1e-3: {share:.2f}%" if share is not None
                 else _title(run), fontsize=9)
    ax.set_xlabel("conv weight")
  axes[0][0].set_ylabel("count")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return path


def filters(runs: list[Run], path: str) -> str | None:
  chosen = {k: r for k, r in _first_seed(runs).items()
            if r.config.training.adversarial}
  if not chosen:
    return None
  n = len(chosen)
  kernels = {name: _npz(run)["figure_layer_kernel"][:, :, :16, :16]
             for name, run in chosen.items()}   # (3, 3, in, out)
  # one colour scale for all panels: the paper compares magnitudes
  vmax = max(float(np.abs(k).max()) for k in kernels.values()) or 1.0
  fig = Figure(figsize=(5 * n, 5))
  axes = fig.subplots(1, n, squeeze=False)
  for ax, (name, run) in zip(axes[0], chosen.items()):
    k = kernels[name]
    # 16 x 16 tiles of 3x3 kernels, one pixel apart
    tiles = np.full((16 * 4, 16 * 4), np.nan)
    for i in range(k.shape[2]):
      for o in range(k.shape[3]):
        tiles[i * 4:i * 4 + 3, o * 4:o * 4 + 3] = k[:, :, i, o]
    ax.imshow(tiles, cmap="seismic", vmin=-vmax, vmax=vmax)
    stats = files.load_json(
        os.path.join(run.workdir, "analysis.json"), files.ANALYSIS) or {}
    ax.set_title(f"{_title(run)}\n{stats.get('figure_layer', '')} "
                 f"(16 inputs x 16 filters, colour scale +-{vmax:.3g})",
                 fontsize=8)
    ax.axis("off")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return path


def channel_norms(runs: list[Run], path: str) -> str | None:
  chosen = _first_seed(runs)
  if not chosen:
    return None
  n = len(chosen)
  fig = Figure(figsize=(9, 2.8 * n))
  axes = fig.subplots(n, 2, squeeze=False)
  for (ax_all, ax_zoom), run in zip(axes, chosen.values()):
    data = _npz(run)
    readings = [("u", "tab:orange")]
    if run.config.sparsity.method == "admm":
      readings.insert(0, ("w", "tab:blue"))
    # the zoom: the smallest tenth of the range of the norms
    zoom = 0.1 * max(float(data[f"{t}_channel_norms"].max(initial=0.0))
                     for t, _ in readings) or 0.1
    for tag, color in readings:
      norms = data[f"{tag}_channel_norms"].ravel()
      pruned = int(np.sum(norms < 1e-15))
      label = f"{tag}: {pruned}/{norms.size} channels < 1e-15"
      ax_all.hist(norms, bins=80, color=color, alpha=0.6, label=label)
      ax_zoom.hist(norms[norms < zoom], bins=50, range=(0, zoom),
                   color=color, alpha=0.6, label=label)
    ax_all.set_title(f"{_title(run)}: channel norms", fontsize=9)
    ax_zoom.set_title(f"zoom: norms < {zoom:.3g}", fontsize=9)
    ax_all.legend(fontsize=7)
    ax_zoom.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return path


def lambda_sweep(data: dict[str, Any], path: str) -> str | None:
  """Figs. 4-5 from a table's collected results (mean +- std per point):
  channel sparsity and A1-A4 against lambda1 (:func:`_sweep_figure`)."""
  return _save(_sweep_figure(data, "sparsity.lamb1", "lambda1",
                             "channel_sparsity"), path)


def beta_sweep(data: dict[str, Any], path: str) -> str | None:
  """Table 1 as a figure: weight sparsity and A1-A4 against RVSM's beta
  (log scale), per net (:func:`_sweep_figure`)."""
  return _save(_sweep_figure(data, "sparsity.beta", "beta", "sparsity",
                             log_x=True), path)


def _save(fig, path: str) -> str | None:
  if fig is None:
    return None
  fig.savefig(path, dpi=110)
  return path


def _sweep_figure(data: dict[str, Any], param: str, x_label: str,
                  sparsity: str, log_x: bool = False):
  """One panel per metric (``sparsity``, A1-A4), a line per net over the
  rows that set ``param``.

  Each line joins the means over seeds; each seed's value is a small dot
  beside it, since with 1-3 seeds a standard deviation says less than the
  values themselves (two seeds pruned 0.2% and 92% give a mean of 46 ±
  65). The sparsity panel labels each point with the epochs of the
  checkpoints evaluated (one per seed): where the best-validation rule kept
  an early one, the point shows that epoch's net, not the last one's. It
  also draws the paper's sparsities where the paper gives them (hollow
  markers, dashed); the accuracies' panels leave them out, being on another
  scale (the tables' Markdown files have them).
  """
  series: dict[str, list[tuple[float, dict[str, Any], list[int],
                               list[dict[str, float]]]]] = {}
  paper: dict[str, list[tuple[float, float]]] = {}
  for row in data["rows"]:
    if not row["summary"] or param not in row["overrides"]:
      continue
    net, x = row["label"]["Net"], row["overrides"][param]
    done = [e for e in row.get("runs", ()) if e.get("status") == "done"]
    epochs = [e["checkpoint_epoch"] for e in done
              if e.get("checkpoint_epoch")]
    seeds = [e.get("metrics", {}) for e in done]
    series.setdefault(net, []).append((x, row["summary"], epochs, seeds))
    if row.get("paper", {}).get(sparsity) is not None:
      paper.setdefault(net, []).append((x, row["paper"][sparsity]))
  if not series:
    return None
  panels = [sparsity, "A1", "A2", "A3", "A4"]
  fig = Figure(figsize=(3.4 * len(panels), 3.2))
  axes = fig.subplots(1, len(panels))
  for ax, metric in zip(axes, panels):
    for i, (net, points) in enumerate(sorted(series.items())):
      points = sorted((p for p in points if metric in p[1]),
                      key=lambda p: p[0])
      if not points:
        continue
      (line,) = ax.plot([x for x, *_ in points],
                        [s[metric]["mean"] for _, s, _, _ in points],
                        marker="o", label=net)
      color = line.get_color()
      dots = [(x, m[metric]) for x, _, _, seeds in points for m in seeds
              if metric in m]
      # Each net's dots a few points to its own side, so two nets' seeds
      # at the same x stay apart (on linear and log axes alike).
      dodge = transforms.ScaledTranslation(
          (i - (len(series) - 1) / 2) * 4 / 72, 0, fig.dpi_scale_trans)
      if dots:
        ax.scatter(*zip(*dots), edgecolors=color, zorder=3,
                   transform=ax.transData + dodge, **SEED_DOTS)
        # A shifted transform leaves the axes' limits to us.
        ax.update_datalim(dots)
        ax.autoscale_view()
      if metric == sparsity:
        for x, s, epochs, _ in points:
          if epochs:
            ax.annotate("ep " + ",".join(map(str, epochs)),
                        (x, s[metric]["mean"]), textcoords="offset points",
                        # Each net's labels on their own side of the line.
                        xytext=(4, -10 if i % 2 == 0 else 5),
                        fontsize=6, color=color)
        if net in paper:
          px, py = zip(*sorted(paper[net]))
          ax.plot(px, py, linestyle="--", marker="o", mfc="none",
                  color=color, label=f"{net}, paper")
    if log_x:
      ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_title(data["metrics"].get(metric, metric)
                 + (" (ep: checkpoint epochs)" if metric == sparsity
                    else ""), fontsize=9)
    ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


# The curves figure's panels per line of the figure.
_CURVE_COLUMNS = 5
_SPARSITIES = {"channel_sparsity": "channels pruned (%)",
               "weight_sparsity": "weights pruned (%)"}


def _pruned_kind(config) -> str:
  """What the row's sparsifier prunes: channels or single weights."""
  sparsity = config.sparsity
  channels = sparsity.method == "rgsm" or (
      sparsity.method == "admm" and sparsity.structure == "channel")
  return "channel_sparsity" if channels else "weight_sparsity"


def _row_title(row: dict[str, Any]) -> str:
  """``ResNet20\nbeta 1, lambda1 0.05``: a row's label over two lines, its
  settings named, those that do not apply left out."""
  parts = [v if k in ("Net", "Method", "Pruning", "Training") else f"{k} {v}"
           for k, v in row["label"].items() if v != "n/a"]
  if not parts:
    return row["name"]
  return parts[0] + ("\n" + ", ".join(parts[1:]) if parts[1:] else "")


def training_curves(runs: list[Run], data: dict[str, Any],
                    path: str) -> str | None:
  """Writes :func:`training_figure` to ``path``; returns ``path``, or None
  (nothing written) when no sparsified run has finished."""
  fig = training_figure(runs, data)
  if fig is None:
    return None
  fig.savefig(path, dpi=100)
  return path


def training_figure(runs: list[Run], data: dict[str, Any]
                    ) -> Figure | None:
  """Each sparsified row's training, epoch by epoch: the natural
  validation accuracy (the checkpoint rule's measure) above the sparsity
  of the checkpoint (channels or weights, what its sparsifier prunes), a
  line per seed and the evaluated checkpoint's epoch filled.

  It shows where the rule (best validation accuracy) kept a net from
  before the sparsifier pruned: a short schedule's first projection can
  cost more validation accuracy than the remaining epochs win back.
  """
  # The finished runs the table reports, by (row, seed): their evaluated
  # checkpoint's epoch.
  done = {(row["name"], e["seed"]): e.get("checkpoint_epoch")
          for row in data.get("rows", ()) for e in row.get("runs", ())
          if e.get("status") == "done"}
  columns: dict[str, list[tuple[int, list[dict[str, Any]], int | None]]] = {}
  runs_by_row = {run.row.name: run for run in runs}
  for run in sorted(runs, key=lambda r: r.seed):
    key = (run.row.name, run.seed)
    if run.config.sparsity.method == "none" or key not in done:
      continue
    records = [r for r in metric_logging.read_metrics(run.workdir)
               if "epoch" in r]
    if records:
      columns.setdefault(run.row.name, []).append(
          (run.seed, records, done[key]))
  if not columns:
    return None
  labels = {row["name"]: _row_title(row) for row in data["rows"]}
  n = len(columns)
  width = min(n, _CURVE_COLUMNS)
  lines = -(-n // width)
  fig = Figure(figsize=(3.0 * width, 4.6 * lines))
  axes = fig.subplots(2 * lines, width, squeeze=False)
  for i, (name, seeds) in enumerate(columns.items()):
    top = axes[2 * (i // width), i % width]
    bottom = axes[2 * (i // width) + 1, i % width]
    sparsity = _pruned_kind(runs_by_row[name].config)
    for seed, records, chosen in seeds:
      epochs = [r["epoch"] for r in records]
      for ax, key in ((top, "val_natural_accuracy"), (bottom, sparsity)):
        values = [r.get(key) for r in records]
        (line,) = ax.plot(epochs, values, marker="o", markersize=3,
                          markerfacecolor="none", linewidth=1,
                          label=f"seed {seed}")
        if chosen in epochs:
          ax.plot(chosen, values[epochs.index(chosen)], marker="o",
                  markersize=6, color=line.get_color())
    top.set_title(labels.get(name, name), fontsize=8)
    top.set_ylabel("validation natural accuracy (%)", fontsize=7)
    bottom.set_ylabel(_SPARSITIES[sparsity], fontsize=7)
    # every panel on one scale: the rows' sparsities compare at a glance
    bottom.set_ylim(-2, 102)
    bottom.set_xlabel("epoch", fontsize=7)
    ticks = sorted({r["epoch"] for _, records, _ in seeds for r in records})
    for ax in (top, bottom):
      ax.set_xticks(ticks)
      ax.tick_params(labelsize=7)
    top.legend(fontsize=6)
  for i in range(n, lines * width):
    axes[2 * (i // width), i % width].axis("off")
    axes[2 * (i // width) + 1, i % width].axis("off")
  fig.suptitle("Training of each sparsified row (filled: the evaluated "
               "checkpoint, best validation accuracy)", fontsize=9)
  fig.tight_layout()
  return fig


def draw(kind: str, runs: list[Run], data: dict[str, Any],
         path: str) -> str | None:
  if kind == "weight_histograms":
    return weight_histograms(runs, path)
  if kind == "filters":
    return filters(runs, path)
  if kind == "channel_norms":
    return channel_norms(runs, path)
  if kind == "lambda_sweep":
    return lambda_sweep(data, path)
  if kind == "beta_sweep":
    return beta_sweep(data, path)
  if kind == "training":
    return training_curves(runs, data, path)
  raise ValueError(f"unknown figure {kind!r}")
