"""Architecture description of a slim network: explicit channels per layer.

A :class:`NetSpec` says, for every layer of a slimmed pre-activation ResNet,
which channels of the original network it keeps (``*_channels``, original
indices, for reports) and where they sit in the tensors it reads
(``index``: positions to gather, ``None`` when it reads every channel). It is
plain data (ints, floats, tuples), hashable, and round-trips through JSON, so
an exported slim model is rebuilt from ``architecture.json`` alone.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

def _tuple(x: Sequence[int] | None) -> tuple[int, ...] | None:
  return None if x is None else tuple(int(i) for i in x)


@dataclasses.dataclass(frozen=True)
class ConvSpec:
  """A square, zero-padded (``size // 2``), bias-free convolution.

  Attributes:
    size: kernel size.
    strides: stride in both spatial dimensions.
    in_full, out_full: channels of the original layer.
    in_channels: original input channels it still reads.
    out_channels: original output channels it still computes.
    index: positions of ``in_channels`` in the tensor the layer is given
      (``None``: all of it, in order).
    has_const: whether a ``const_kernel`` of shape ``(size, size, 1, out)``
      adds what input channels known to be constant contributed (their
      contribution varies at the borders, where the padding is zero).
  """
  size: int
  strides: int
  in_full: int
  out_full: int
  in_channels: tuple[int, ...]
  out_channels: tuple[int, ...]
  index: tuple[int, ...] | None = None
  has_const: bool = False

  def __post_init__(self):
    object.__setattr__(self, "in_channels", _tuple(self.in_channels))
    object.__setattr__(self, "out_channels", _tuple(self.out_channels))
    object.__setattr__(self, "index", _tuple(self.index))


@dataclasses.dataclass(frozen=True)
class NormSpec:
  """An inference BatchNorm (running statistics) followed by ReLU.

  Attributes:
    full: channels of the original layer.
    channels: original channels it still normalises.
    index: their positions in the tensor it is given (``None``: all).
  """
  full: int
  channels: tuple[int, ...]
  index: tuple[int, ...] | None = None

  def __post_init__(self):
    object.__setattr__(self, "channels", _tuple(self.channels))
    object.__setattr__(self, "index", _tuple(self.index))


@dataclasses.dataclass(frozen=True)
class BlockSpec:
  """``bn1-relu-conv1-bn2-relu-conv2`` plus ``shortcut``.

  Attributes:
    name: ``stageS_blockB``, as in the original parameter tree.
    bn1, conv1, bn2, conv2: the layers; ``conv1`` and ``shortcut`` read the
      output of ``bn1`` (its ``channels``), ``conv2`` that of ``bn2``.
    shortcut: ``"identity"`` (the block's input is added), ``"none"`` (no
      skip connection) or the projection's :class:`ConvSpec`.
  """
  name: str
  bn1: NormSpec
  conv1: ConvSpec
  bn2: NormSpec
  conv2: ConvSpec
  shortcut: ConvSpec | str


@dataclasses.dataclass(frozen=True)
class DenseSpec:
  """The classifier on the pooled features of ``bn_final``.

  Attributes:
    in_full: features of the original layer.
    in_channels: original features it still reads.
    index: their positions in ``bn_final``'s output (``None``: all).
    features: number of logits.
  """
  in_full: int
  in_channels: tuple[int, ...]
  features: int
  index: tuple[int, ...] | None = None

  def __post_init__(self):
    object.__setattr__(self, "in_channels", _tuple(self.in_channels))
    object.__setattr__(self, "index", _tuple(self.index))


@dataclasses.dataclass(frozen=True)
class NetSpec:
  """A slim pre-activation ResNet (one ensemble member).

  Attributes:
    stem: the first convolution, on the (normalised) image.
    blocks: the residual blocks in order.
    bn_final: the BatchNorm before pooling.
    head: the classifier.
    mean, std: per-channel input normalisation (``None``: none).
    noise_coef: ``c`` of ``out + c * std(out) * N(0, 1)`` after every block;
      0 for a deterministic network.
    noise_std_over: ``"batch"`` or ``"example"`` (see
      :func:`fkjax.models.inject_noise`).
    source: the original architecture, e.g. ``"ResNet8"``, for reports.
  """
  stem: ConvSpec
  blocks: tuple[BlockSpec, ...]
  bn_final: NormSpec
  head: DenseSpec
  mean: tuple[float, ...] | None = None
  std: tuple[float, ...] | None = None
  noise_coef: float = 0.0
  noise_std_over: str = "batch"
  source: str = ""

  def __post_init__(self):
    object.__setattr__(self, "blocks", tuple(self.blocks))
    for name in ("mean", "std"):
      value = getattr(self, name)
      if value is not None:
        object.__setattr__(self, name, tuple(float(v) for v in value))

  @property
  def widths(self) -> dict[str, int]:
    """Output channels of every convolution, by layer path."""
    out = {"stem": len(self.stem.out_channels)}
    for block in self.blocks:
      out[f"{block.name}/conv1"] = len(block.conv1.out_channels)
      out[f"{block.name}/conv2"] = len(block.conv2.out_channels)
      if isinstance(block.shortcut, ConvSpec):
        out[f"{block.name}/shortcut"] = len(block.shortcut.out_channels)
    return out


def to_dict(spec: NetSpec) -> dict[str, Any]:
  """A JSON-ready dict of ``spec``."""
  return dataclasses.asdict(spec)


def from_dict(d: dict[str, Any]) -> NetSpec:
  """The :class:`NetSpec` that :func:`to_dict` wrote."""
  def block(b):
    sc = b["shortcut"]
    return BlockSpec(
        name=b["name"], bn1=NormSpec(**b["bn1"]), conv1=ConvSpec(**b["conv1"]),
        bn2=NormSpec(**b["bn2"]), conv2=ConvSpec(**b["conv2"]),
        shortcut=sc if isinstance(sc, str) else ConvSpec(**sc))
  return NetSpec(
      stem=ConvSpec(**d["stem"]), blocks=tuple(block(b) for b in d["blocks"]),
      bn_final=NormSpec(**d["bn_final"]), head=DenseSpec(**d["head"]),
      mean=d.get("mean"), std=d.get("std"),
      noise_coef=float(d.get("noise_coef", 0.0)),
      noise_std_over=d.get("noise_std_over", "batch"),
      source=d.get("source", ""))


def dumps(specs: Sequence[NetSpec], **extra: Any) -> str:
  """JSON of a slim network (one spec) or ensemble (several), with ``extra``."""
  return json.dumps({"format": "fkjax.slim/1", **extra,
                     "members": [to_dict(s) for s in specs]}, indent=1)


def loads(text: str) -> tuple[list[NetSpec], dict[str, Any]]:
  """``(specs, extra)`` from :func:`dumps`'s JSON."""
  d = json.loads(text)
  if d.get("format") != "fkjax.slim/1":
    raise ValueError(f"not an fkjax.slim architecture: format "
                     f"{d.get('format')!r}")
  specs = [from_dict(m) for m in d.pop("members")]
  d.pop("format")
  return specs, d
