"""Weight statistics of a trained run, for the paper's figures and Sec. 3.

``analyze_run(config, workdir)`` restores the checkpoint that ``eval.py``
evaluates and measures, on the conv kernels of both the trained weights ``w``
and the evaluated ones ``u`` (the sparse projection; ``u = w`` without a
sparsifier):

* the share of weights with ``|w| < 1e-3`` (the paper's Sec. 3: NT 8.66%, AT
  3.64% for ResNet20) and of exact zeros;
* the share of channel groups with norm ``< 1e-15`` (the paper's channel
  sparsity) and ``< 1e-3``;
* quantiles of ``|w|`` and of the channel norms;
* histogram counts on fixed bins, all channel norms and the block of one
  conv layer's kernel that the paper's weight figures draw (its first
  ``FIGURE_BLOCK`` inputs and filters, the same layer for every net), saved
  in ``analysis.npz`` so that a table's figures are drawn without the
  checkpoints. Only that block is kept because it is all the figure draws:
  ``reproduce.report.figures.filters`` tiles 16 inputs x 16 filters of 3x3 kernels
  per net (the paper's Fig. 2a-b shows part of the layer, its appendix the
  whole; at 64 x 64 kernels a panel's tiles would be too small to compare
  side by side, and no figure reads the rest).

Both readings matter for ADMM, whose ``w`` stays dense while ``u`` is the
projection (issue 16, protocol table).
"""
from __future__ import annotations

# First, before the imports below (seconds): Ctrl-C, or a missing package of
# the [train] extra, during them is one line (fkjax.entry).
from fkjax import entry
if __name__ == "__main__":
  entry.start()
# pylint: disable=wrong-import-position

import argparse
import os
import sys
from typing import Any

import jax
import ml_collections
import numpy as np

from fkjax import checkpoint as ckpt_lib
from fkjax import atomic
from fkjax import cli
from fkjax.config import record as run_config
from fkjax.training import build
from fkjax.training import sparsify
from fkjax import sparsity

ANALYSIS_JSON = "analysis.json"
ANALYSIS_NPZ = "analysis.npz"
FIGURE_BLOCK = 16   # inputs x filters of the figure layer: what it draws

# Fixed histogram bins, so that histograms of different runs add and compare.
WEIGHT_BINS = np.linspace(-0.5, 0.5, 401)
LOG_ABS_BINS = np.linspace(-8.0, 0.0, 321)   # log10 |w|, exact zeros apart
QUANTILES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9)
SMALL = 1e-3


def conv_kernels(params: Any, layout: str = "HWIO"
                 ) -> list[tuple[str, np.ndarray]]:
  """``(name, kernel)`` of every conv kernel, in tree order, on the host
  (``layout``: ``"MHWIO"`` for an EnResNet's member-stacked kernels)."""
  host = jax.device_get(params)
  mask = sparsity.conv_kernel_mask(host, layout)
  out = []
  for (path, leaf), keep in zip(jax.tree_util.tree_leaves_with_path(host),
                                jax.tree.leaves(mask)):
    if keep:
      out.append((sparsity.masks.path_name(path), np.asarray(leaf)))
  return out


def figure_layer(kernels: list[tuple[str, np.ndarray]]
                 ) -> tuple[str, np.ndarray]:
  """The layer of the paper's weight figures: the first 64x64 3x3 conv.

  The paper plots "a convolutional layer of ResNet20 whose shape is
  64x64x3x3" and the same layer of the first member of En5ResNet20. Tree
  order is the same for every depth and ensemble size, so the first 3x3
  kernel with 64 inputs and outputs is the same layer in both (member 0 of
  a member-stacked kernel). Falls back to the widest 3x3 kernel.
  """
  def core(k):
    return k[0] if k.ndim == 5 else k
  spatial = [(n, core(k)) for n, k in kernels if core(k).shape[0] == 3]
  for name, k in spatial:
    if k.shape[2] == 64 and k.shape[3] == 64:
      return name, k
  name, k = max(spatial or [(n, core(k)) for n, k in kernels],
                key=lambda nk: nk[1].shape[2] * nk[1].shape[3])
  return name, k


def _stats(params: Any, group: str, layout: str
           ) -> tuple[dict[str, Any], dict[str, Any]]:
  kernels = conv_kernels(params, layout)
  flat = np.concatenate([k.ravel() for _, k in kernels]).astype(np.float64)
  report = sparsity.sparsity_report(params, group=group, layout=layout)
  norms = report.channel_norms()
  magnitude = np.abs(flat)
  nonzero = magnitude[magnitude > 0]
  stats = {
      "num_weights": int(flat.size),
      "zero_share": float(np.mean(flat == 0) * 100),
      "small_share": float(np.mean(magnitude < SMALL) * 100),
      "num_channels": int(norms.size),
      "channel_sparsity": float(report.channel_sparsity),
      "small_channel_share": float(np.mean(norms < SMALL) * 100)
                             if norms.size else 0.0,
      "abs_quantiles": {str(q): float(np.quantile(magnitude, q))
                        for q in QUANTILES},
      "channel_norm_quantiles": {str(q): float(np.quantile(norms, q))
                                 for q in QUANTILES} if norms.size else {},
  }
  arrays = {
      "weight_hist": np.histogram(flat, WEIGHT_BINS)[0],
      "log_abs_hist": np.histogram(np.log10(nonzero), LOG_ABS_BINS)[0],
      "channel_norms": norms.astype(np.float32),
  }
  return stats, arrays


def analyze_params(w: Any, u: Any, group: str = "input",
                   layout: str = "HWIO"
                   ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Statistics of trained ``w`` and evaluated ``u`` (see the module doc);
  ``layout`` of their conv kernels as :func:`conv_kernels`.

  Returns:
    ``(summary, arrays)``: JSON data ``{"w": {...}, "u": {...},
    "figure_layer": name}`` and the arrays of ``analysis.npz``.
  """
  summary: dict[str, Any] = {}
  arrays: dict[str, np.ndarray] = {"weight_bins": WEIGHT_BINS,
                                   "log_abs_bins": LOG_ABS_BINS}
  for tag, params in (("w", w), ("u", u)):
    stats, arr = _stats(params, group, layout)
    summary[tag] = stats
    arrays.update({f"{tag}_{k}": v for k, v in arr.items()})
  name, kernel = figure_layer(conv_kernels(u, layout))
  summary["figure_layer"] = name
  arrays["figure_layer_kernel"] = kernel[:, :, :FIGURE_BLOCK,
                                         :FIGURE_BLOCK].astype(np.float32)
  return summary, arrays


def analyze_run(config: ml_collections.ConfigDict, workdir: str,
                exp: build.Experiment | None = None
                ) -> dict[str, Any]:
  """Analyses the checkpoint ``config.eval.checkpoint`` of ``workdir``.

  Writes ``analysis.npz`` then ``analysis.json`` (the JSON last: its
  presence means both are complete) and returns the JSON data.
  """
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = exp or build.Experiment.build(config)
    step, state = exp.restore(checkpointer, config.eval.checkpoint)
  u = sparsify.eval_variables(state, config)["params"]
  summary, arrays = analyze_params(
      state["params"], u, group=config.sparsity.group,
      layout=sparsify.kernel_layout(config))
  summary.update(checkpoint=config.eval.checkpoint, step=int(step))
  with atomic.replacing(os.path.join(workdir, ANALYSIS_NPZ), "wb") as f:
    np.savez_compressed(f, **arrays)
  atomic.write_json(os.path.join(workdir, ANALYSIS_JSON), summary)
  return summary


def main(argv: list[str] | None = None) -> int:
  """``python -m reproduce.analysis --workdir=W``: analyses a run
  with its own ``config.json`` (as ``eval.py`` evaluates it)."""
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("--workdir", required=True)
  args = parser.parse_args(argv)
  # A wrong or unfinished workdir is one line (cli.guard), as in eval.py.
  config = run_config.config_for_eval(args.workdir, None, {}, False)
  summary = analyze_run(config, args.workdir)
  for tag in ("w", "u"):
    s = summary[tag]
    print(f"{tag}: |w|<1e-3 {s['small_share']:.2f}%, zeros "
          f"{s['zero_share']:.2f}%, channels < 1e-15 "
          f"{s['channel_sparsity']:.2f}%, < 1e-3 "
          f"{s['small_channel_share']:.2f}%")
  return 0


if __name__ == "__main__":
  sys.exit(cli.guard(main))
