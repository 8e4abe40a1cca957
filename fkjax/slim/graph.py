"""A PreActResNet's variables as channel spaces and the layers between them.

A *space* is a set of channels that must stay aligned: a stage's residual
stream (with skip connections, written by the stem or a projection and by
every block's ``conv2``), a block's inner tensor (``conv1`` to ``conv2``), or
a block's output when there is no skip. Its *producers* are the
convolutions writing it; its *readers* the convolutions, or the classifier,
reading ``relu(bn(space))``. :mod:`fkjax.slim.liveness` decides on this graph
which channels survive.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

PyTree = Any
BatchNormVars = dict[str, np.ndarray]  # scale, bias, mean, var


@dataclasses.dataclass
class Space:
  """A tensor's channels, and the layers that write and read them."""
  size: int
  noised: bool = False  # noise is injected into it: every channel stays
  producers: list[str] = dataclasses.field(default_factory=list)
  readers: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Layer:
  """A convolution (HWIO kernel) or the classifier (kernel ``(1, 1, I, O)``)."""
  path: str
  kernel: np.ndarray
  inp: str                   # space it reads
  out: str | None            # space it writes (None: the logits)
  bn: str | None             # path of the BatchNorm in front (None: stem)
  strides: int = 1
  bias: np.ndarray | None = None  # the classifier's


@dataclasses.dataclass
class Graph:
  """The spaces, the layers by path, and the BatchNorms' variables by path."""
  spaces: dict[str, Space] = dataclasses.field(default_factory=dict)
  layers: dict[str, Layer] = dataclasses.field(default_factory=dict)
  bns: dict[str, BatchNormVars] = dataclasses.field(default_factory=dict)

  def add_layer(self, layer: Layer) -> None:
    """Adds ``layer`` as a reader of its input and a producer of its output."""
    self.layers[layer.path] = layer
    self.spaces[layer.inp].readers.append(layer.path)
    if layer.out is not None:
      self.spaces[layer.out].producers.append(layer.path)


class BlockLayout(NamedTuple):
  """One residual block of the architecture."""
  name: str         # stageS_blockB
  strides: int
  cin: int
  cout: int
  projection: bool  # a 1x1 shortcut convolution (skip and shape changes)


def block_layout(depth: int, width: int, skip: bool) -> list[BlockLayout]:
  """The blocks of a PreActResNet of ``depth`` (6n+2) and ``width``."""
  if (depth - 2) % 6 or depth < 8:
    raise ValueError(f"depth must be 6n+2 with n >= 1, got {depth}")
  n = (depth - 2) // 6
  blocks, cin = [], 16 * width
  for stage, f in enumerate((16, 32, 64)):
    for b in range(n):
      strides = 2 if stage > 0 and b == 0 else 1
      cout = f * width
      blocks.append(BlockLayout(f"stage{stage + 1}_block{b + 1}", strides,
                                cin, cout,
                                skip and (strides != 1 or cin != cout)))
      cin = cout
  return blocks


def bn_variables(params: PyTree, stats: PyTree, path: str) -> BatchNormVars:
  """The scale, bias and running statistics of the BatchNorm at ``path``."""
  p, s = params, stats
  for k in path.split("/"):
    p, s = p[k], s[k]
  return {"scale": p["scale"], "bias": p["bias"], "mean": s["mean"],
          "var": s["var"]}


def _add_block(graph: Graph, params: PyTree, stats: PyTree,
               block: BlockLayout, stream: str, skip: bool, noised: bool
               ) -> str:
  """Adds ``block``'s spaces, BatchNorms and layers; returns its output."""
  name = block.name
  mid = f"{name}/mid"
  graph.spaces[mid] = Space(block.cout)
  if not skip:
    out = f"{name}/out"
    graph.spaces[out] = Space(block.cout, noised=noised)
  elif block.projection:
    out = f"{name}/stream"
    graph.spaces[out] = Space(block.cout, noised=noised)
  else:
    out = stream  # the identity shortcut: the block writes its input space
  p = params[name]
  for bn in ("bn1", "bn2"):
    graph.bns[f"{name}/{bn}"] = bn_variables(params, stats, f"{name}/{bn}")
  graph.add_layer(Layer(f"{name}/conv1", p["conv1"]["kernel"], stream, mid,
                        f"{name}/bn1", block.strides))
  graph.add_layer(Layer(f"{name}/conv2", p["conv2"]["kernel"], mid, out,
                        f"{name}/bn2"))
  if block.projection:
    graph.add_layer(Layer(f"{name}/shortcut", p["shortcut"]["kernel"],
                          stream, out, f"{name}/bn1", block.strides))
  return out


def build_graph(params: PyTree, stats: PyTree, blocks: list[BlockLayout],
                skip: bool, noised: bool) -> Graph:
  """The graph of a PreActResNet's (numpy) variables.

  ``noised``: noise is injected after every block (into its output space).
  """
  graph = Graph()
  stem = params["stem"]["kernel"]
  graph.spaces["image"] = Space(stem.shape[2])
  stream = "stream0" if skip else "stem_out"
  # With skips the stem's output is stage 1's stream, noised after every
  # block; without, only the blocks' outputs are noised.
  graph.spaces[stream] = Space(stem.shape[3], noised=skip and noised)
  graph.add_layer(Layer("stem", stem, "image", stream, None))
  for block in blocks:
    stream = _add_block(graph, params, stats, block, stream, skip, noised)
  graph.bns["bn_final"] = bn_variables(params, stats, "bn_final")
  head = params["head"]
  graph.add_layer(Layer("head", head["kernel"][None, None], stream, None,
                        "bn_final", bias=head["bias"]))
  return graph
