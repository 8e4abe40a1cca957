"""Which channels of a :class:`fkjax.slim.graph.Graph` survive (the rules:
:mod:`fkjax.slim.analysis`), as a :class:`Plan`.

Masks are boolean arrays over a space's (or a reader's input) channels, in
the original order, keyed by space name or layer path.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from fkjax.slim.graph import BatchNormVars, Graph

BN_EPS = 1e-5  # PyTorch's BatchNorm2d epsilon, as fkjax.models uses
Masks = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the slim network keeps of ``graph``.

  Attributes:
    graph: the original network.
    const: per reader, its input channels that are constant.
    const_value: per reader behind a BatchNorm, ``relu(bn(0))`` per channel.
    used: per reader, the non-constant input channels it needs.
    reads: per reader, the input channels it gathers (``used`` plus, with
      rounding, channels read through zero weights).
    keep: per space, the channels the slim network computes.
  """
  graph: Graph
  const: Masks
  const_value: Masks
  used: Masks
  reads: Masks
  keep: Masks


def bn_constant(bn: BatchNormVars) -> np.ndarray:
  """``relu(bn(0))`` per channel, in float32 as BatchNorm computes it."""
  f32 = np.float32
  mul = (1.0 / np.sqrt(bn["var"].astype(f32) + f32(BN_EPS))).astype(f32)
  mul = mul * bn["scale"].astype(f32)
  return np.maximum((-bn["mean"].astype(f32)) * mul + bn["bias"].astype(f32),
                    f32(0))


def zero_channels(graph: Graph) -> Masks:
  """Per space, the channels that are exactly zero.

  Every producer's output column is zero and no noise is injected (a space
  without producers, the image, has none).
  """
  zero = {}
  for name, space in graph.spaces.items():
    z = np.zeros(space.size, bool)
    if space.producers and not space.noised:
      z = np.ones(space.size, bool)
      for prod in space.producers:
        z &= ~np.any(graph.layers[prod].kernel != 0, axis=(0, 1, 2))
    zero[name] = z
  return zero


def constant_inputs(graph: Graph, zero: Masks) -> tuple[Masks, Masks]:
  """``(const, const_value)``: per reader, which inputs are constant, and
  ``relu(bn(0))`` of its BatchNorm (none for the stem, which reads the image).

  A channel is constant when it is exactly zero or its BatchNorm's scale is.
  """
  const, const_value = {}, {}
  for path, layer in graph.layers.items():
    if layer.bn is None:
      const[path] = np.zeros(graph.spaces[layer.inp].size, bool)
      continue
    bn = graph.bns[layer.bn]
    const[path] = zero[layer.inp] | (bn["scale"] == 0)
    const_value[path] = bn_constant(bn)
  return const, const_value


def _used_inputs(graph: Graph, const: Masks, keep: Masks) -> Masks:
  """Per reader, the non-constant inputs with a non-zero weight to a kept
  output (the classifier keeps every logit)."""
  used = {}
  for path, layer in graph.layers.items():
    kept_out = (keep[layer.out] if layer.out is not None
                else np.ones(layer.kernel.shape[3], bool))
    nonzero = np.any(layer.kernel[..., kept_out] != 0, axis=(0, 1, 3))
    used[path] = nonzero & ~const[path]
  return used


def live_channels(graph: Graph, const: Masks) -> tuple[Masks, Masks]:
  """``(keep, used)`` at the fixed point of "a space keeps a channel that a
  reader uses, or every channel when it is noised".

  Iterated because dropping an output channel can leave an input channel
  unused.
  """
  keep = {name: np.ones(s.size, bool) for name, s in graph.spaces.items()}
  while True:
    used = _used_inputs(graph, const, keep)
    new = {}
    for name, space in graph.spaces.items():
      k = np.full(space.size, space.noised)
      for reader in space.readers:
        k |= used[reader]
      new[name] = k
    if all(np.array_equal(new[n], keep[n]) for n in graph.spaces):
      return keep, used
    keep = new


def round_up(mask: np.ndarray, pool: np.ndarray, multiple: int
             ) -> np.ndarray:
  """``mask`` plus the first channels of ``pool`` it lacks, to a multiple.

  All of ``pool`` when fewer than ``multiple`` channels would be left out.
  """
  count, available = int(mask.sum()), int(pool.sum())
  target = min(available, -(-count // multiple) * multiple)
  if available - target < multiple:
    target = available
  out = mask.copy()
  out[np.flatnonzero(pool & ~mask)[:max(0, target - count)]] = True
  return out


def round_widths(graph: Graph, keep: Masks, used: Masks, multiple: int
                 ) -> tuple[Masks, Masks]:
  """``(keep, reads)`` with every width rounded up to ``multiple``.

  A space keeps extra channels (a noised space keeps all already); a reader
  gathers extra kept channels of its input, read through zero weights.
  """
  if multiple <= 1:
    return keep, dict(used)
  keep = {name: (k if graph.spaces[name].noised
                 else round_up(k, np.ones(k.size, bool), multiple))
          for name, k in keep.items()}
  reads = {path: round_up(used[path], keep[layer.inp], multiple)
           for path, layer in graph.layers.items()}
  return keep, reads


def plan(graph: Graph, multiple: int = 1) -> Plan:
  """The channels the slim network of ``graph`` keeps and reads."""
  const, const_value = constant_inputs(graph, zero_channels(graph))
  keep, used = live_channels(graph, const)
  keep, reads = round_widths(graph, keep, used, multiple)
  return Plan(graph, const, const_value, used, reads, keep)
