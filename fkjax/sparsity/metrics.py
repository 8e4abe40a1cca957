"""Sparsity metrics as the paper reports them (host-side, NumPy).

* Weight sparsity: % of exactly-zero entries among the sparsified leaves (and,
  separately, among all parameters).
* Channel sparsity: % of channel groups whose ℓ2 norm is ``< 1e-15``, among the
  sparsified leaves. Stacked kernels (layouts ``"MHWIO"``, ``"LHWIO"``, ...)
  count one group per channel of every layer of the stack.

The reports take any tree a user holds; leaves that are not weights (see
:mod:`fkjax.sparsity.leaves`) are left out of every count and named in the
report.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from fkjax.sparsity import layouts as layouts_lib
from fkjax.sparsity import leaves as leaves_lib
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
    num_channels: number of channel groups (of every layer, if stacked).
    channels_pruned: groups with norm ``< 1e-15``.
    channel_norms: the group norms, shape ``(*stack, channels)``: one row per
      layer of a stacked kernel (its ``M``, ``L``, ``S`` axes, in order).
    layout: the leaf's layout, e.g. ``"HWIO"``; empty when it has none
      (only possible with explicit ``group`` axes).
  """

  name: str
  shape: tuple[int, ...]
  size: int
  zeros: int
  num_channels: int
  channels_pruned: int
  channel_norms: np.ndarray = dataclasses.field(repr=False)
  layout: str = ""


def _percent(num: int, den: int) -> float:
  return 100.0 * num / den if den else 0.0


@dataclasses.dataclass(frozen=True)
class SparsityReport:
  """Sparsity of a parameter tree; see :func:`sparsity_report`.

  Attributes:
    weight_sparsity: % zero entries among the sparsified (masked) leaves.
    total_weight_sparsity: % zero entries among all parameters (weights).
    channel_sparsity: % channel groups with norm < 1e-15 (masked leaves).
    layers: one :class:`LayerSparsity` per masked leaf, in tree order.
    skipped: the leaves that are not weights (RNG keys, counters, BatchNorm
      statistics, functions, ...), left out of every count, in tree order.
  """

  weight_sparsity: float
  total_weight_sparsity: float
  channel_sparsity: float
  layers: tuple[LayerSparsity, ...]
  skipped: tuple[leaves_lib.SkippedLeaf, ...] = ()

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
    by_kind: dict[str, list[str]] = {}
    for leaf in self.skipped:
      by_kind.setdefault(leaf.kind, []).append(leaf.name)
    for kind, names in by_kind.items():
      lines.append(f"not weights, left out ({kind}): {', '.join(names)}")
    return "\n".join(lines)


def _channel_norms(
    w: np.ndarray,
    group: operators.Group,
    layout: layouts_lib.Layout | None,
) -> np.ndarray:
  """The group norms, one row per layer of the stack (see LayerSparsity)."""
  # `layout` is None only with explicit group axes: one flat row of groups.
  axes = operators.group_axes(group, w.ndim, layout or "HWIO")
  norms = np.sqrt(np.sum(np.square(w.astype(np.float64)), axis=axes,
                         keepdims=True))
  if layout is None:
    return norms.reshape(-1)
  # The operators' per-layer order, so histograms and counts see every
  # layer's channels.
  norms = layout.layers_first(norms)
  return norms.reshape(*norms.shape[: len(layout.stack_axes)], -1)


def sparsity_report(
    params: PyTree,
    mask: masks.Mask = masks.CONV_KERNELS,
    group: operators.Group = "input",
    layout: layouts_lib.LayoutSpec = None,
) -> SparsityReport:
  """Weight and channel sparsity of ``params``, overall and per layer.

  Args:
    params: any tree holding the weights (device or host arrays; fetched to
      the host): Flax linen params or variables, ``nnx.state(model)``, an
      Equinox module, dicts, lists, tuples. Leaves that are not weights (RNG
      keys, counters, BatchNorm statistics, functions, ...; see
      :mod:`fkjax.sparsity.leaves`) are left out and named in
      ``SparsityReport.skipped``.
    mask: the sparsified leaves; default: conv kernels.
    group: channel grouping for channel counts and norms.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).

  Returns:
    A :class:`SparsityReport`.

  Raises:
    ValueError: when the mask selects no weight, or a selected leaf has no
      layout and ``group`` is a name.
  """
  operators.check_group(group)
  spec = layouts_lib.normalize(layout)
  keep = jax.tree.leaves(masks.resolve_mask(mask, params, spec))
  kinds = leaves_lib.classify(params)
  total_zeros = total_size = 0
  layers, skipped = [], []
  for (path, leaf), is_masked, kind in zip(
      jax.tree_util.tree_leaves_with_path(params), keep, kinds, strict=True):
    if kind is not None:
      skipped.append(leaves_lib.SkippedLeaf(masks.path_name(path), kind))
      continue
    w = np.asarray(jax.device_get(leaf))
    total_zeros += int(np.count_nonzero(w == 0))
    total_size += w.size
    if is_masked:
      layers.append(_layer_sparsity(path, w, group, spec))
  if not layers:
    raise masks.nothing_selected_error("sparsity_report", mask, params, spec)
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
      skipped=tuple(skipped),
  )


def _layer_sparsity(
    path: tuple[Any, ...],
    w: np.ndarray,
    group: operators.Group,
    spec: layouts_lib.Layouts,
) -> LayerSparsity:
  found = spec.for_leaf(path, w)
  if found is None and isinstance(group, str):
    raise ValueError(
        f"fkjax.sparsity.sparsity_report: {masks.path_name(path)!r} has "
        f"shape {w.shape}, which no layout describes ({spec.describe()}): "
        "pass its layout with `layout=`, or explicit axes as `group`."
    )
  norms = _channel_norms(w, group, found)
  return LayerSparsity(
      name=masks.path_name(path),
      shape=tuple(w.shape),
      size=int(w.size),
      zeros=int(np.count_nonzero(w == 0)),
      num_channels=int(norms.size),
      channels_pruned=int(np.count_nonzero(norms < CHANNEL_ZERO_TOL)),
      channel_norms=norms,
      layout=str(found) if found else "",
  )
