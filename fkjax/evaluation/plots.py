"""PNG figures of a trained model's weights (matplotlib, no display needed).

* ``weight_histogram``: all conv weights (the paper's Figs. 1-2).
* ``channel_norm_histogram``: channel-group norms, with pruned channels
  counted apart (Fig. 3).
* ``conv_filters_grid``: one conv layer's 3x3 kernels as an image grid
  (appendix figures); for an ensemble, the first member.
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
                  ) -> list[tuple[str, np.ndarray]]:
  mask = sparsity.conv_kernel_mask(params, layout)
  out = []
  for (path, leaf), keep in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(mask)):
    if keep:
      # the layer names of the sparsity report's table
      out.append((sparsity.masks.path_name(path), np.asarray(leaf)))
  return out


def weight_histogram(params: Any, path: str, bins: int = 200,
                     layout: Any = None) -> str:
  weights = np.concatenate([k.ravel() for _, k in _conv_kernels(params,
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


def conv_filters_grid(params: Any, path: str, layer: int | None = None,
                      max_filters: int = 16, layout: Any = None) -> str:
  """Kernels ``[:, :, i, o]`` of one conv layer, inputs by rows.

  A pruned input channel shows as a blank row. ``layer`` indexes the conv
  kernels in tree order; default the middle 3x3 layer.
  """
  kernels = _conv_kernels(params, layout)
  if layer is None:   # the middle one of the 3x3 (not 1x1) layers
    spatial = [k for k in kernels if k[1].shape[-4] > 1] or kernels
    name, kernel = spatial[len(spatial) // 2]
  else:
    name, kernel = kernels[layer]
  if kernel.ndim == 5:   # member axis first: show member 0
    kernel, name = kernel[0], f"{name} (member 0)"
  n_in = min(kernel.shape[2], max_filters)
  n_out = min(kernel.shape[3], max_filters)
  vmax = float(np.abs(kernel).max()) or 1.0
  fig = Figure(figsize=(n_out * 0.6, n_in * 0.6))
  axes = fig.subplots(n_in, n_out, squeeze=False)
  for i in range(n_in):
    for o in range(n_out):
      axes[i, o].imshow(kernel[:, :, i, o], cmap="seismic", vmin=-vmax,
                        vmax=vmax)
      axes[i, o].axis("off")
  fig.suptitle(f"{name}: {n_in} inputs x {n_out} filters")
  fig.savefig(path, dpi=100)
  return path


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
