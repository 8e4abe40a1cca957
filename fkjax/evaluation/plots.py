"""PNG figures of a trained model's weights (matplotlib, no display needed).

* ``weight_histogram``: all conv weights (the paper's Figs. 1-2).
* ``channel_norm_histogram``: channel-group norms, with pruned channels
  counted apart (Fig. 3).
* ``conv_filters_grid``: every 3x3 kernel of one conv layer as an image
  grid, pruned channels marked (appendix figures); for an ensemble (or any
  stacked kernel), the first member.
"""
from __future__ import annotations

import os
from typing import Any

import jax
# Figures made from matplotlib.figure.Figure, not pyplot: they need no
# backend, so plotting neither picks one for the process nor opens windows.
from matplotlib.figure import Figure
import numpy as np

from fkjax import sparsity


def _conv_kernels(params: Any, layout: Any = None
                  ) -> list[tuple[str, np.ndarray, sparsity.Layout]]:
  """``(name, kernel, layout)`` of every conv kernel, in tree order."""
  spec = sparsity.layouts.normalize(layout)
  mask = sparsity.conv_kernel_mask(params, spec)
  out = []
  for (path, leaf), keep in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(mask)):
    if keep:
      # the layer names of the sparsity report's table
      out.append((sparsity.masks.path_name(path), np.asarray(leaf),
                  spec.for_leaf(path, leaf)))
  return out


# How the filter grid's title names the first layer of a stacked axis.
_STACK_NAMES = {"M": "member", "L": "layer", "S": "stack entry"}


def _first_layer_hwio(name: str, kernel: np.ndarray,
                      layout: sparsity.Layout) -> tuple[str, np.ndarray]:
  """The first layer of a stacked kernel (``MHWIO``, ``LHWIO``, ...) as
  ``[h, w, in, out]``, whatever the layout's order (``OIHW``, ...)."""
  if layout.stack_axes:
    kernel = layout.layers_first(kernel)[(0,) * len(layout.stack_axes)]
    first = ", ".join(_STACK_NAMES.get(layout.axes[a], layout.axes[a]) + " 0"
                      for a in layout.stack_axes)
    name = f"{name} ({first})"
  one = layout.layer.axes
  spatial = [a for a in one if a not in "IO"]
  if len(spatial) != 2:
    raise ValueError(
        f"{name}: the filter grid draws 2-D convolutions; layout {layout} "
        f"has {len(spatial)} spatial axes.")
  return name, kernel.transpose([one.index(a) for a in (*spatial, "I", "O")])


def weight_histogram(params: Any, path: str, bins: int = 200,
                     layout: Any = None) -> str:
  weights = np.concatenate([k.ravel() for _, k, _ in _conv_kernels(params,
                                                                    layout)])
  zeros = np.mean(weights == 0) * 100
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  ax.hist(weights[weights != 0], bins=bins, color="tab:blue")
  ax.set_yscale("log")
  ax.set_xlabel("conv weight value (exact zeros excluded)")
  ax.set_ylabel("count")
  ax.set_title(f"{weights.size} conv weights, {zeros:.2f}% exactly zero")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def channel_norm_histogram(report: sparsity.SparsityReport, path: str,
                           bins: int = 100) -> str:
  norms = report.channel_norms()
  pruned = norms < sparsity.CHANNEL_ZERO_TOL
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  ax.hist(norms[~pruned], bins=bins, color="tab:orange")
  ax.set_xlabel("channel l2 norm (pruned channels excluded)")
  ax.set_ylabel("count")
  ax.set_title(f"{norms.size} channels, {pruned.sum()} pruned "
               f"({report.channel_sparsity:.2f}%)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def _tiled(kernel: np.ndarray) -> np.ndarray:
  """``kernel`` ``[h, w, in, out]`` as one image: input ``i``'s kernel for
  filter ``o`` at row block ``i``, column block ``o``, a NaN pixel between
  blocks."""
  h, w, n_in, n_out = kernel.shape
  canvas = np.full((n_in * (h + 1) - 1, n_out * (w + 1) - 1), np.nan,
                   np.float32)
  for i in range(n_in):
    for o in range(n_out):
      canvas[i * (h + 1):i * (h + 1) + h,
             o * (w + 1):o * (w + 1) + w] = kernel[:, :, i, o]
  return canvas


def conv_filters_grid(params: Any, path: str, layer: int | None = None,
                      layout: Any = None) -> str:
  """Writes :func:`conv_filters_figure` to ``path``; returns ``path``."""
  conv_filters_figure(params, layer, layout).savefig(path, dpi=120)
  return path


def conv_filters_figure(params: Any, layer: int | None = None,
                        layout: Any = None) -> Figure:
  """Every kernel ``[:, :, i, o]`` of one conv layer, inputs by rows,
  filters by columns: the whole layer, so that every pruned channel shows;
  for a stacked kernel (layout ``"MHWIO"``, ``"LHWIO"``, ...), its first
  layer.

  A pruned input channel shows as a blank row (and a pruned filter as a
  blank column), marked in red on the axis. ``layer`` indexes the conv
  kernels in tree order; default the middle 3x3 layer.
  """
  kernels = [_first_layer_hwio(*k) for k in _conv_kernels(params, layout)]
  if layer is None:   # the middle one of the 3x3 (not 1x1) layers
    spatial = [k for k in kernels if k[1].shape[0] > 1] or kernels
    name, kernel = spatial[len(spatial) // 2]
  else:
    name, kernel = kernels[layer]
  h, w, n_in, n_out = kernel.shape
  dead_in = np.flatnonzero(~np.any(kernel != 0, axis=(0, 1, 3)))
  dead_out = np.flatnonzero(~np.any(kernel != 0, axis=(0, 1, 2)))
  vmax = float(np.abs(kernel).max()) or 1.0
  # About 0.2 inch a 3x3 kernel, within a readable figure.
  scale = min(0.2, 12.0 / max(n_in, n_out))
  fig = Figure(figsize=(max(4.0, n_out * scale + 1.5),
                        max(3.0, n_in * scale + 1.2)))
  ax = fig.subplots()
  tiled = _tiled(kernel)
  ax.imshow(tiled, cmap="seismic", vmin=-vmax, vmax=vmax,
            interpolation="nearest")
  ax.set_facecolor("0.85")   # the gaps between kernels
  step = max(1, -(-max(n_in, n_out) // 16))
  ax.set_yticks([i * (h + 1) + h / 2 - 0.5 for i in range(0, n_in, step)],
                [str(i) for i in range(0, n_in, step)], fontsize=6)
  ax.set_xticks([o * (w + 1) + w / 2 - 0.5 for o in range(0, n_out, step)],
                [str(o) for o in range(0, n_out, step)], fontsize=6)
  ax.set_ylabel("input channel")
  ax.set_xlabel("filter (output channel)")
  for i in dead_in:
    ax.plot(-1.5, i * (h + 1) + h / 2 - 0.5, "r>", markersize=3,
            clip_on=False)
  for o in dead_out:
    ax.plot(o * (w + 1) + w / 2 - 0.5, -1.5, "rv", markersize=3,
            clip_on=False)
  # The marks sit outside the image, which alone sets the limits.
  ax.set_xlim(-0.5, tiled.shape[1] - 0.5)
  ax.set_ylim(tiled.shape[0] - 0.5, -0.5)
  ax.set_title(f"{name}: all {n_in} inputs x {n_out} filters "
               f"({h}x{w}); pruned (red): {len(dead_in)} inputs, "
               f"{len(dead_out)} filters", fontsize=8)
  fig.tight_layout()
  return fig


def save_all(params: Any, report: sparsity.SparsityReport,
             directory: str, layout: Any = None) -> dict[str, str]:
  """Writes the three figures to ``directory``; returns their paths.

  ``layout``: the conv kernels' layout (``"MHWIO"`` for an EnResNet's
  member-stacked kernels; see :mod:`fkjax.sparsity.layouts`).
  """
  os.makedirs(directory, exist_ok=True)
  return {
      "weight_histogram": weight_histogram(
          params, os.path.join(directory, "weight_histogram.png"),
          layout=layout),
      "channel_norm_histogram": channel_norm_histogram(
          report, os.path.join(directory, "channel_norms.png")),
      "conv_filters": conv_filters_grid(
          params, os.path.join(directory, "conv_filters.png"),
          layout=layout),
  }
