"""Which channels a pruned ResNet can lose, and the slim variables.

The network is seen as *channel spaces* (tensors that must keep the same
channels: a stage's residual stream, shared by the stem or projection and
every block's ``conv2`` when there are skip connections; a block's inner
tensor between ``conv1`` and ``conv2``) with *producers* (the convolutions
writing them) and *readers* (the convolutions, or the classifier, reading
``relu(bn(space))``).

* A reader's input channel is *constant* when the space's channel is exactly
  zero (every producer's output column is zero, and no noise is injected
  into the space) or when the reader's BatchNorm scale is zero: it reads
  ``k = relu(bn(0))``. Its contribution is folded: into the classifier's
  bias, or into a ``const_kernel`` that convolves a ones image (a constant
  channel through a zero-padded convolution is not constant at the borders).
* A reader *uses* a non-constant input channel when its kernel has a
  non-zero weight from it to an output channel that is kept.
* A space keeps a channel when a reader uses it, or when noise is injected
  into the space: ``std(out)`` runs over every channel, so the slim model
  keeps the tensor whole and draws the same noise.

Producers compute only the kept channels, BatchNorms normalise only the
channels their readers use, readers gather those. The liveness is iterated
to a fixed point (dropping an output channel can leave an input channel
unused). Every step is exact: the slim network computes the same function up
to float rounding.

:func:`slim_member` runs the three steps: :mod:`fkjax.slim.graph` (the
spaces and layers), :mod:`fkjax.slim.liveness` (what survives) and
:mod:`fkjax.slim.assemble` (the slim specs and variables).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fkjax.slim import assemble, graph, liveness
from fkjax.slim.spec import NetSpec

PyTree = Any


def _np(tree: PyTree) -> PyTree:
  if isinstance(tree, dict) or hasattr(tree, "items"):
    return {k: _np(v) for k, v in tree.items()}
  return np.asarray(tree)


def _network_fields(config: dict[str, Any], noised: bool) -> dict[str, Any]:
  """The :class:`NetSpec` fields that are not layers: input normalisation,
  noise, and the original's name for reports."""
  mean, std = config.get("mean"), config.get("std")
  depth, width = int(config.get("depth", 20)), int(config.get("width", 1))
  skip = bool(config.get("skip", True))
  return dict(
      mean=None if mean is None else tuple(mean),
      std=None if std is None else tuple(std),
      noise_coef=float(config.get("noise_coef", 0.0)) if noised else 0.0,
      noise_std_over=config.get("noise_std_over", "batch"),
      source=f"ResNet{depth}" + (f"x{width}" if width != 1 else "")
      + ("" if skip else " (no skip)"))


def slim_member(config: dict[str, Any], params: PyTree, batch_stats: PyTree,
                keep_noise: bool = True, multiple: int = 1
                ) -> tuple[NetSpec, dict[str, PyTree]]:
  """Slims one :class:`PreActResNet`'s variables.

  Args:
    config: ``depth, num_classes, width, skip, noise_coef, noise_std_over,
      mean, std`` of the original network.
    params, batch_stats: its variables (no member axis).
    keep_noise: keep the noise injection (and hence every channel of the
      tensors it goes into); False builds a deterministic network, the
      original with ``add_noise=False``.
    multiple: round every width up to a multiple of this, with channels
      computed but read through zero weights (see :func:`fkjax.slim.slim`).

  Returns:
    ``(spec, variables)`` of a :class:`fkjax.slim.SlimResNet`.
  """
  skip = bool(config.get("skip", True))
  noised = keep_noise and bool(config.get("noise_coef", 0.0))
  blocks = graph.block_layout(int(config.get("depth", 20)),
                              int(config.get("width", 1)), skip)
  network = graph.build_graph(_np(params), _np(batch_stats), blocks, skip,
                              noised)
  plan = liveness.plan(network, multiple)
  layers, variables = assemble.layers(plan, blocks, skip)
  return NetSpec(**layers, **_network_fields(config, noised)), variables
