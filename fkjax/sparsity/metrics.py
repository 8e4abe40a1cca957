"""Sparsity metrics as the paper reports them (host-side, NumPy).

* Weight sparsity: % of exactly-zero entries among the sparsified leaves (and,
  separately, among all parameters).
* Channel sparsity: % of channel groups whose ℓ2 norm is ``< 1e-15``, among the
  sparsified leaves. Member-stacked kernels count one group per member.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from fkjax.sparsity import masks
from fkjax.sparsity import operators

PyTree = Any

# The paper's definition of a pruned channel.
CHANNEL_ZERO_TOL = 1e-15


@dataclasses.dataclass(frozen=True)
class LayerSparsity:
  """One sparsified leaf.

  Attributes:
    name: key path, e.g. ``"Conv_0/kernel"``.
    shape: the leaf's shape.
    size: number of entries.
    zeros: number of exactly-zero entries.
    num_channels: number of channel groups (times members, if stacked).
    channels_pruned: groups with norm ``< 1e-15``.
    channel_norms: the group norms, shape ``(*members, channels)``.
  """

  name: str
  shape: tuple[int, ...]
  size: int
  zeros: int
  num_channels: int
  channels_pruned: int
  channel_norms: np.ndarray = dataclasses.field(repr=False)


def _percent(num: int, den: int) -> float:
  return 100.0 * num / den if den else 0.0


@dataclasses.dataclass(frozen=True)
class SparsityReport:
  """Sparsity of a parameter tree; see :func:`sparsity_report`.

  Attributes:
    weight_sparsity: % zero entries among the sparsified (masked) leaves.
    total_weight_sparsity: % zero entries among all parameters.
    channel_sparsity: % channel groups with norm < 1e-15 (masked leaves).
    layers: one :class:`LayerSparsity` per masked leaf, in tree order.
  """

  weight_sparsity: float
  total_weight_sparsity: float
  channel_sparsity: float
  layers: tuple[LayerSparsity, ...]

  def channel_norms(self) -> np.ndarray:
    """All channel-group norms as one flat array (the paper's histograms)."""
    if not self.layers:
      return np.zeros([0])
    return np.concatenate([l.channel_norms.ravel() for l in self.layers])

  def format_table(self) -> str:
    """The per-layer table as aligned plain text, with a total line."""
    header = ("layer", "shape", "zeros", "weight sp. %", "channels",
              "pruned", "channel sp. %")
    rows = [header]
    for l in self.layers:
      rows.append((
          l.name,
          "x".join(map(str, l.shape)),
          str(l.zeros),
          f"{_percent(l.zeros, l.size):.2f}",
          str(l.num_channels),
          str(l.channels_pruned),
          f"{_percent(l.channels_pruned, l.num_channels):.2f}",
      ))
    rows.append((
        "total (masked)",
        "",
        str(sum(l.zeros for l in self.layers)),
        f"{self.weight_sparsity:.2f}",
        str(sum(l.num_channels for l in self.layers)),
        str(sum(l.channels_pruned for l in self.layers)),
        f"{self.channel_sparsity:.2f}",
    ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"all parameters: {self.total_weight_sparsity:.2f} % zeros")
    return "\n".join(lines)


def _channel_norms(w: np.ndarray, group: operators.Group) -> np.ndarray:
  axes = operators.group_axes(group, w.ndim)
  norms = np.sqrt(np.sum(np.square(w.astype(np.float64)), axis=axes))
  # One row of groups per member (leading axes), so histograms and counts see
  # every member's channels.
  lead = w.shape[: max(w.ndim - 4, 0)]
  return norms.reshape(*lead, -1) if lead else norms.reshape(-1)


def sparsity_report(
    params: PyTree,
    mask: masks.Mask = masks.CONV_KERNELS,
    group: operators.Group = "input",
) -> SparsityReport:
  """Weight and channel sparsity of ``params``, overall and per layer.

  Args:
    params: a parameter tree (device or host arrays; fetched to the host).
    mask: the sparsified leaves; default: conv kernels.
    group: channel grouping for channel counts and norms.

  Returns:
    A :class:`SparsityReport`.
  """
  host = jax.device_get(params)
  keep = masks.resolve_mask(mask, host)
  leaves = jax.tree_util.tree_leaves_with_path(host)
  keep_leaves = jax.tree.leaves(keep)
  total_zeros = total_size = 0
  layers = []
  for (path, leaf), is_masked in zip(leaves, keep_leaves):
    w = np.asarray(leaf)
    zeros = int(np.count_nonzero(w == 0))
    total_zeros += zeros
    total_size += w.size
    if not is_masked:
      continue
    norms = _channel_norms(w, group)
    layers.append(
        LayerSparsity(
            name=masks.path_name(path),
            shape=tuple(w.shape),
            size=int(w.size),
            zeros=zeros,
            num_channels=int(norms.size),
            channels_pruned=int(np.count_nonzero(norms < CHANNEL_ZERO_TOL)),
            channel_norms=norms,
        )
    )
  return SparsityReport(
      weight_sparsity=_percent(
          sum(l.zeros for l in layers), sum(l.size for l in layers)
      ),
      total_weight_sparsity=_percent(total_zeros, total_size),
      channel_sparsity=_percent(
          sum(l.channels_pruned for l in layers),
          sum(l.num_channels for l in layers),
      ),
      layers=tuple(layers),
  )
