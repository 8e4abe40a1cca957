"""Parameters and multiply-adds per layer, before and after slimming."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from fkjax.slim.spec import ConvSpec, NetSpec


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """One layer of one member.

  Attributes:
    name: e.g. ``"member_0/stage2_block1/conv1"``.
    shape_before, shape_after: kernel shape (``(channels,)`` for BatchNorm).
    params_before, params_after: trainable parameters (BatchNorm: scale and
      bias; its running statistics are not counted, as in fkjax's reports).
    macs_before, macs_after: multiply-adds per image. Convolutions and the
      classifier only (BatchNorm, ReLU, noise and pooling are elementwise);
      the folded constants (``const_kernel``) run once per batch, not per
      image, so they add parameters and no per-image multiply-adds.
  """
  name: str
  shape_before: tuple[int, ...]
  shape_after: tuple[int, ...]
  params_before: int
  params_after: int
  macs_before: int
  macs_after: int


def _out(n: int, size: int, strides: int) -> int:
  return (n + 2 * (size // 2) - size) // strides + 1


def _conv(name, s: ConvSpec, hw):
  ho, wo = _out(hw[0], s.size, s.strides), _out(hw[1], s.size, s.strides)
  before = (s.size, s.size, s.in_full, s.out_full)
  after = (s.size, s.size, len(s.in_channels), len(s.out_channels))
  area = s.size * s.size
  const = area * after[3] if s.has_const else 0
  cost = LayerCost(name, before, after, area * before[2] * before[3],
                   area * after[2] * after[3] + const,
                   ho * wo * area * before[2] * before[3],
                   ho * wo * area * after[2] * after[3])
  return cost, (ho, wo)


def _norm(name, full, kept):
  return LayerCost(name, (full,), (kept,), 2 * full, 2 * kept, 0, 0)


def layer_costs(spec: NetSpec, image_size: Sequence[int] = (32, 32),
                prefix: str = "") -> list[LayerCost]:
  """Costs of every layer of one slim member on ``image_size`` images."""
  hw = tuple(image_size)
  costs = []
  stem, hw = _conv(prefix + "stem", spec.stem, hw)
  costs.append(stem)
  for b in spec.blocks:
    name = prefix + b.name
    costs.append(_norm(f"{name}/bn1", b.bn1.full, len(b.bn1.channels)))
    conv1, out_hw = _conv(f"{name}/conv1", b.conv1, hw)
    costs.append(conv1)
    costs.append(_norm(f"{name}/bn2", b.bn2.full, len(b.bn2.channels)))
    costs.append(_conv(f"{name}/conv2", b.conv2, out_hw)[0])
    if isinstance(b.shortcut, ConvSpec):
      costs.append(_conv(f"{name}/shortcut", b.shortcut, hw)[0])
    hw = out_hw
  costs.append(_norm(prefix + "bn_final", spec.bn_final.full,
                     len(spec.bn_final.channels)))
  h = spec.head
  before, after = (h.in_full, h.features), (len(h.in_channels), h.features)
  costs.append(LayerCost(prefix + "head", before, after,
                         before[0] * before[1] + h.features,
                         after[0] * after[1] + h.features,
                         before[0] * before[1], after[0] * after[1]))
  return costs


def cost_report(specs: Sequence[NetSpec],
                image_size: Sequence[int] = (32, 32)) -> list[LayerCost]:
  """:func:`layer_costs` of every member (names prefixed ``member_M/``)."""
  if len(specs) == 1:
    return layer_costs(specs[0], image_size)
  out = []
  for m, spec in enumerate(specs):
    out += layer_costs(spec, image_size, prefix=f"member_{m}/")
  return out


def totals(costs: Sequence[LayerCost]) -> dict[str, int]:
  """Summed ``params_before/after`` and ``macs_before/after``."""
  keys = ("params_before", "params_after", "macs_before", "macs_after")
  return {k: sum(getattr(c, k) for c in costs) for k in keys}


def format_costs(costs: Sequence[LayerCost]) -> str:
  """A plain-text table, one row per layer and a total."""
  def shape(s):
    return "x".join(str(d) for d in s)

  def pct(after, before):
    return f"{100.0 * after / before:6.1f}" if before else "     -"

  rows = [("layer", "shape before", "shape after", "params before",
           "params after", "MACs before", "MACs after", "MACs %")]
  for c in costs:
    rows.append((c.name, shape(c.shape_before), shape(c.shape_after),
                 f"{c.params_before:,}", f"{c.params_after:,}",
                 f"{c.macs_before:,}", f"{c.macs_after:,}",
                 pct(c.macs_after, c.macs_before)))
  t = totals(costs)
  rows.append(("total", "", "", f"{t['params_before']:,}",
               f"{t['params_after']:,}", f"{t['macs_before']:,}",
               f"{t['macs_after']:,}",
               pct(t["macs_after"], t["macs_before"])))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = []
  for i, r in enumerate(rows):
    cells = [r[0].ljust(widths[0])] + [v.rjust(w) for v, w in
                                        zip(r[1:], widths[1:])]
    lines.append("  ".join(cells))
    if i == 0 or i == len(rows) - 2:
      lines.append("-" * len(lines[-1]))
  return "\n".join(lines)
