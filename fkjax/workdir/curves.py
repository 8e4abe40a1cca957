"""A run's training curves as a PNG: ``<workdir>/plots/training_curves.png``.

Drawn from ``metrics.jsonl`` (one record per epoch, the last one logged:
``fkjax.workdir.metric_logging.read_metrics``) after every epoch, so a
glance shows how a run goes without TensorBoard: the training and
validation accuracies, the training loss, and the weight and channel
sparsity over the epochs. Figures come from ``matplotlib.figure.Figure``,
not pyplot: plotting picks no backend for the process and opens no window.
The file is replaced whole (written beside it, then renamed).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from fkjax import atomic

PLOTS_DIR = "plots"
FILENAME = "training_curves.png"

# The record keys of the loss and sparsity panels (the accuracy panel's:
# every key ending in _accuracy, training's first).
_LOSS = ("train_loss",)
_SPARSITY = ("weight_sparsity", "channel_sparsity")


def path_of(workdir: str) -> str:
  """Where :func:`save` writes the curves of the run in ``workdir``."""
  return os.path.join(workdir, PLOTS_DIR, FILENAME)


def _accuracy_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
  keys = []
  for record in records:
    keys += [k for k in record if k.endswith("_accuracy") and k not in keys]
  return sorted(keys, key=lambda k: (not k.startswith("train_"), k))


def _series(records: Sequence[Mapping[str, Any]], key: str
            ) -> tuple[list[int], list[float]]:
  """``(epochs, values)`` of ``key`` over the records that have it."""
  pairs = [(r["epoch"], float(r[key])) for r in records
           if isinstance(r.get(key), (int, float)) and "epoch" in r]
  return [e for e, _ in pairs], [v for _, v in pairs]


def figure(records: Sequence[Mapping[str, Any]]) -> Any:
  """The curves of ``records`` (``read_metrics``'s) as a matplotlib
  ``Figure``: accuracies, loss, sparsity side by side."""
  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator
  fig = Figure(figsize=(13, 3.8))
  panels = fig.subplots(1, 3)
  for ax, title, keys, unit in (
      (panels[0], "accuracy", _accuracy_keys(records), "%"),
      (panels[1], "training loss", _LOSS, ""),
      (panels[2], "sparsity", _SPARSITY, "%")):
    for key in keys:
      epochs, values = _series(records, key)
      if epochs:
        ax.plot(epochs, values, marker="o", markersize=3, label=key)
    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if unit:
      ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  last = records[-1] if records else {}
  fig.suptitle(f"training curves: {len(records)} epoch(s)"
               + (f", step {last['step']}" if "step" in last else ""))
  fig.tight_layout()
  return fig


def save(workdir: str, records: Sequence[Mapping[str, Any]]) -> str | None:
  """Draws ``records``, the run's ``metrics.jsonl`` as ``read_metrics``
  reads it, into ``<workdir>/plots/training_curves.png``; returns its path
  (None: no epoch recorded yet)."""
  if not records:
    return None
  path = path_of(workdir)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig = figure(records)
  with atomic.replacing(path, "wb") as f:
    fig.savefig(f, dpi=100, format="png")
  return path
