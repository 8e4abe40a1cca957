"""The run's sparsifier, from ``config.sparsity``: the weights it evaluates
and its report on them.

Training (the optax chain, the end of an epoch, the epoch's record) and
evaluation (the evaluated ``u``, the sparsity a result file records) both
read a run's sparsity through these functions.
"""
from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from fkjax import sparsity
from fkjax.config import record as run_config

PyTree = Any


def kernel_layout(config: ml_collections.ConfigDict) -> str:
  """Layout of the model's conv kernels: an EnResNet stacks its members'
  kernels on a leading axis."""
  return "MHWIO" if config.model.ensemble_size > 1 else "HWIO"


def sparsifier(config: ml_collections.ConfigDict) -> sparsity.Sparsifier:
  """The sparsification method of ``config.sparsity``, with its
  hyperparameters validated."""
  try:
    return sparsity.from_config(config.sparsity, layout=kernel_layout(config))
  except (TypeError, ValueError) as e:
    raise run_config.ConfigError(f"config.sparsity: {e}") from e


def eval_variables(state: dict[str, PyTree], config: ml_collections.ConfigDict
                   ) -> dict[str, PyTree]:
  """The variables evaluated: the sparse ``u`` for every method."""
  return {"params": sparsifier(config).evaluated_params(state["params"]),
          "batch_stats": state["batch_stats"]}


def sparsity_report(params: PyTree, config: ml_collections.ConfigDict
                    ) -> sparsity.SparsityReport:
  """Weight and channel sparsity of ``params`` (the evaluated ``u``)."""
  return sparsifier(config).report(params, group=config.sparsity.group)


def near_zero_shares(params: PyTree, config: ml_collections.ConfigDict,
                     tol: float = 1e-3) -> dict[str, float]:
  """% of conv weights with ``|w| < tol`` and of channel groups with norm
  ``< tol``: the paper's Sec. 3 measure, and a reading of sparsity that
  does not need exact zeros (ADMM's dense ``w``)."""
  report = sparsity_report(params, config)
  mask = sparsity.conv_kernel_mask(params, kernel_layout(config))
  small = total = 0
  for leaf, keep in zip(jax.tree.leaves(params), jax.tree.leaves(mask)):
    if keep:
      w = np.asarray(leaf)
      small += int(np.sum(np.abs(w) < tol))
      total += w.size
  norms = report.channel_norms()
  return {"weights_below_1e-3": 100.0 * small / max(total, 1),
          "channels_below_1e-3": 100.0 * float(np.mean(norms < tol))
                                 if norms.size else 0.0}
