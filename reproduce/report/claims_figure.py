"""``claims.png``: every comparison of ``claims.json`` on one page.

One line per comparison, grouped under its claim: fkjax's difference
(the paper's higher row minus its lower row, so right of zero is the
paper's direction) with ``Z`` standard errors of the seeds' means as its
error bar, the test sample's noise band (``Z`` standard errors around zero:
a dot inside it is "within test-sample noise") and the paper's own
difference. The dot's colour is the comparison's verdict; a hollow dot is a
comparison the claims flag (a checkpoint from before the sparsifier pruned,
or before the last epoch). Accuracies and sparsities are two panels, as
their differences differ tenfold.
"""
from __future__ import annotations

from typing import Any, Mapping

# matplotlib.figure.Figure, not pyplot: no backend chosen, no global state.
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

_COLOURS = {"holds": "tab:green", "reversed": "tab:red"}
_UNRESOLVED = "0.45"
_NOISE = dict(color="tab:blue", alpha=0.25, linewidth=5,
              solid_capstyle="butt")
_LINE = 0.19    # inches per line
_MARGIN = 1.5   # inches per panel: title, axis label


def _panels(data: Mapping[str, Any]
            ) -> list[tuple[str, list[tuple[str, Mapping[str, Any] | None]]]]:
  """(title, lines) of each panel that has a comparison run; a line is
  (label, comparison), or (claim name, None) for the claim's header."""
  panels = []
  accuracies = tuple(data["accuracies"])
  for title, wanted in (
      (f"accuracy ({', '.join(accuracies)})", True), ("sparsity", False)):
    lines: list[tuple[str, Mapping[str, Any] | None]] = []
    for claim in data["claims"]:
      mine = [c for c in claim["comparisons"] if "difference" in c
              and (c["metric"] in accuracies) == wanted]
      if not mine:
        continue
      lines.append((claim["name"], None))
      lines += [(_label(c), c) for c in mine]
    if lines:
      panels.append((title, lines))
  return panels


def has_comparisons(data: Mapping[str, Any]) -> bool:
  """Whether a comparison of the judged claims ``data``
  (:func:`reproduce.report.claims.evaluate`) has run, i.e. whether
  :func:`figure` draws anything."""
  # a comparison not yet run has no difference
  return any("difference" in c for claim in data["claims"]
             for c in claim["comparisons"])


def _label(c: Mapping[str, Any]) -> str:
  metric = c["metric"] + (f" vs {c['lower_metric']}"
                          if c.get("lower_metric") else "")
  seeds = f"{c['seeds'][0]}, {c['seeds'][1]} seeds"
  return f"{c['table']}: {c['higher']} - {c['lower']}, {metric} ({seeds})"


def _flagged(c: Mapping[str, Any]) -> bool:
  return bool(c.get("barely_pruned_checkpoints") or
              c.get("early_checkpoints"))


def claims_figure(data: Mapping[str, Any]) -> Figure | None:
  """The figure :func:`figure` saves, or None when no comparison has run."""
  if not has_comparisons(data):
    return None
  panels = _panels(data)
  z = data["z"]
  heights = [_LINE * len(lines) + _MARGIN for _, lines in panels]
  fig = Figure(figsize=(11, sum(heights)))
  axes = fig.subplots(len(panels), 1, squeeze=False,
                      gridspec_kw={"height_ratios": heights})[:, 0]
  for ax, (title, lines) in zip(axes, panels):
    ys = range(len(lines), 0, -1)
    for y, (_, c) in zip(ys, lines):
      if c is None:
        continue
      if "sample_se" in c:
        ax.plot([-z * c["sample_se"], z * c["sample_se"]], [y, y], **_NOISE)
      colour = _COLOURS.get(c["verdict"], _UNRESOLVED)
      ax.errorbar(c["difference"], y, xerr=z * c.get("seed_se", 0.0),
                  fmt="o", markersize=4.5, color=colour, capsize=2,
                  elinewidth=1, markerfacecolor="white" if _flagged(c)
                  else colour)
      if "paper_difference" in c:
        ax.plot(c["paper_difference"], y, "D", markersize=4,
                markerfacecolor="none", markeredgecolor="black")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(list(ys), [label for label, _ in lines], fontsize=6.5)
    for tick, (_, c) in zip(ax.get_yticklabels(), lines):
      if c is None:
        tick.set_fontweight("bold")
        tick.set_fontsize(7.5)
    ax.set_ylim(0.3, len(lines) + 0.7)
    ax.grid(axis="x", linewidth=0.4, alpha=0.5)
    ax.set_title(f"The paper's claims at the {data['scale']} scale: {title}",
                 fontsize=9)
    ax.set_xlabel("the paper's higher row - its lower row (percentage "
                  "points); right of 0: the paper's direction", fontsize=8)
  axes[-1].legend(handles=[
      Line2D([], [], marker="o", linestyle="none", color=_COLOURS["holds"],
             label="holds"),
      Line2D([], [], marker="o", linestyle="none", color=_COLOURS["reversed"],
             label="reversed"),
      Line2D([], [], marker="o", linestyle="none", color=_UNRESOLVED,
             label="unresolved"),
      Line2D([], [], marker="|", color="black", linewidth=1,
             label=f"bar: {z:g} SE of the seeds' means"),
      Line2D([], [], marker="o", linestyle="none", color=_UNRESOLVED,
             markerfacecolor="white",
             label="flagged checkpoint (claims.md)"),
      Line2D([], [], label=f"test-sample noise ({z:g} SE)", **_NOISE),
      Line2D([], [], marker="D", linestyle="none", markerfacecolor="none",
             markeredgecolor="black", label="the paper"),
  ], fontsize=7, loc="upper center", ncols=4,
                  bbox_to_anchor=(0.5, -0.7 / heights[-1]))
  fig.tight_layout()
  return fig


def figure(data: Mapping[str, Any], path: str) -> str | None:
  """Writes ``claims.png`` of the judged claims ``data``
  (:func:`reproduce.report.claims.evaluate`) to ``path``; returns ``path``,
  or None (nothing written) when no comparison has run."""
  fig = claims_figure(data)
  if fig is None:
    return None
  fig.savefig(path, dpi=110)
  return path
