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
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fkjax.slim.spec import (BlockSpec, ConvSpec, DenseSpec, NetSpec,
                             NormSpec)

PyTree = Any
BN_EPS = 1e-5


@dataclasses.dataclass
class _Space:
  size: int
  noised: bool = False
  producers: list = dataclasses.field(default_factory=list)
  readers: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Layer:
  """A convolution (HWIO kernel) or the classifier (kernel ``(1, 1, I, O)``)."""
  path: str
  kernel: np.ndarray
  inp: str                   # space it reads
  out: str | None            # space it writes (None: the logits)
  bn: str | None             # path of the BatchNorm in front (None: stem)
  strides: int = 1


def _arch(depth: int, width: int, skip: bool):
  """``(name, strides, in_width, out_width, projection)`` per block."""
  if (depth - 2) % 6 or depth < 8:
    raise ValueError(f"depth must be 6n+2 with n >= 1, got {depth}")
  n = (depth - 2) // 6
  blocks, cin = [], 16 * width
  for stage, f in enumerate((16, 32, 64)):
    for b in range(n):
      strides = 2 if stage > 0 and b == 0 else 1
      cout = f * width
      blocks.append((f"stage{stage + 1}_block{b + 1}", strides, cin, cout,
                     skip and (strides != 1 or cin != cout)))
      cin = cout
  return blocks


def _np(tree: PyTree) -> PyTree:
  if isinstance(tree, dict) or hasattr(tree, "items"):
    return {k: _np(v) for k, v in tree.items()}
  return np.asarray(tree)


def _bn_constant(bn: dict[str, np.ndarray]) -> np.ndarray:
  """``relu(bn(0))`` per channel, in float32 as BatchNorm computes it."""
  f32 = np.float32
  mul = (1.0 / np.sqrt(bn["var"].astype(f32) + f32(BN_EPS))).astype(f32)
  mul = mul * bn["scale"].astype(f32)
  return np.maximum((-bn["mean"].astype(f32)) * mul + bn["bias"].astype(f32),
                    f32(0))


def _round_up(mask: np.ndarray, pool: np.ndarray, multiple: int
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
  params, stats = _np(params), _np(batch_stats)
  skip = bool(config.get("skip", True))
  noised = keep_noise and bool(config.get("noise_coef", 0.0))
  blocks = _arch(int(config.get("depth", 20)), int(config.get("width", 1)),
                 skip)

  spaces: dict[str, _Space] = {}
  layers: dict[str, _Layer] = {}
  bns: dict[str, dict[str, np.ndarray]] = {}

  def add_layer(layer: _Layer):
    layers[layer.path] = layer
    spaces[layer.inp].readers.append(layer.path)
    if layer.out is not None:
      spaces[layer.out].producers.append(layer.path)

  def add_bn(path: str):
    p, s = params, stats
    for k in path.split("/"):
      p, s = p[k], s[k]
    bns[path] = {"scale": p["scale"], "bias": p["bias"], "mean": s["mean"],
                 "var": s["var"]}

  stem = params["stem"]["kernel"]
  spaces["image"] = _Space(stem.shape[2])
  stream = "stream0" if skip else "stem_out"
  # With skips the stem's output is stage 1's stream, noised after every
  # block; without, only the blocks' outputs are noised.
  spaces[stream] = _Space(stem.shape[3], noised=skip and noised)
  add_layer(_Layer("stem", stem, "image", stream, None))
  for name, strides, _, cout, projection in blocks:
    mid = f"{name}/mid"
    spaces[mid] = _Space(cout)
    if not skip:
      out = f"{name}/out"
      spaces[out] = _Space(cout, noised=noised)
    elif projection:
      out = f"{name}/stream"
      spaces[out] = _Space(cout, noised=noised)
    else:
      out = stream
    p = params[name]
    add_bn(f"{name}/bn1")
    add_bn(f"{name}/bn2")
    add_layer(_Layer(f"{name}/conv1", p["conv1"]["kernel"], stream, mid,
                     f"{name}/bn1", strides))
    add_layer(_Layer(f"{name}/conv2", p["conv2"]["kernel"], mid, out,
                     f"{name}/bn2"))
    if projection:
      add_layer(_Layer(f"{name}/shortcut", p["shortcut"]["kernel"], stream,
                       out, f"{name}/bn1", strides))
    stream = out
  add_bn("bn_final")
  head = params["head"]
  add_layer(_Layer("head", head["kernel"][None, None], stream, None,
                   "bn_final"))

  # Exactly-zero channels: every producer's column is zero, and no noise.
  zero = {}
  for name, space in spaces.items():
    z = np.zeros(space.size, bool)
    if space.producers and not space.noised:
      z = np.ones(space.size, bool)
      for prod in space.producers:
        z &= ~np.any(layers[prod].kernel != 0, axis=(0, 1, 2))
    zero[name] = z

  # Per BatchNorm: which of its channels are constant, and their value.
  const, const_value = {}, {}
  for path, layer in layers.items():
    if layer.bn is None:
      const[path] = np.zeros(spaces[layer.inp].size, bool)
      continue
    bn = bns[layer.bn]
    const[path] = zero[layer.inp] | (bn["scale"] == 0)
    const_value[path] = _bn_constant(bn)

  keep = {name: np.ones(s.size, bool) for name, s in spaces.items()}
  while True:
    used = {}
    for path, layer in layers.items():
      kept_out = (keep[layer.out] if layer.out is not None
                  else np.ones(layer.kernel.shape[3], bool))
      nonzero = np.any(layer.kernel[..., kept_out] != 0, axis=(0, 1, 3))
      used[path] = nonzero & ~const[path]
    new = {}
    for name, space in spaces.items():
      k = np.full(space.size, space.noised)
      for reader in space.readers:
        k |= used[reader]
      new[name] = k
    if all(np.array_equal(new[n], keep[n]) for n in spaces):
      break
    keep = new

  # What each reader gathers: the channels it uses, and with rounding, kept
  # channels it reads through zero weights.
  reads = dict(used)
  if multiple > 1:
    for name, space in spaces.items():
      if not space.noised:
        keep[name] = _round_up(keep[name], np.ones(space.size, bool),
                               multiple)
    for path, layer in layers.items():
      reads[path] = _round_up(used[path], keep[layer.inp], multiple)

  out_params: dict[str, Any] = {}
  out_stats: dict[str, Any] = {}
  kept_ids = {name: np.flatnonzero(k) for name, k in keep.items()}

  def positions(ids, within):
    if len(ids) == len(within) and np.array_equal(ids, within):
      return None
    lookup = {int(c): i for i, c in enumerate(within)}
    return tuple(lookup[int(c)] for c in ids)

  def set_tree(tree, path, value):
    *parents, leaf = path.split("/")
    for k in parents:
      tree = tree.setdefault(k, {})
    tree[leaf] = value

  def norm(path: str, readers: list[str]) -> tuple[NormSpec, np.ndarray]:
    """The BatchNorm over the channels its readers use."""
    inp = layers[readers[0]].inp
    ids = np.flatnonzero(np.any([reads[r] for r in readers], axis=0))
    bn = bns[path]
    set_tree(out_params, f"{path}/scale", bn["scale"][ids])
    set_tree(out_params, f"{path}/bias", bn["bias"][ids])
    set_tree(out_stats, f"{path}/mean", bn["mean"][ids])
    set_tree(out_stats, f"{path}/var", bn["var"][ids])
    return (NormSpec(full=spaces[inp].size, channels=ids,
                     index=positions(ids, kept_ids[inp])), ids)

  def conv(path: str, given: np.ndarray) -> ConvSpec:
    """A reader convolution given the channels ``given`` of its input."""
    layer = layers[path]
    k = layer.kernel
    in_ids = np.flatnonzero(reads[path])
    out_ids = kept_ids[layer.out]
    set_tree(out_params, f"{path}/kernel", _kernel(path, in_ids, out_ids))
    folded = _folded(path, out_ids)
    if folded is not None:
      set_tree(out_params, f"{path}/const_kernel", folded)
    return ConvSpec(size=k.shape[0], strides=layer.strides,
                    in_full=k.shape[2], out_full=k.shape[3],
                    in_channels=in_ids, out_channels=out_ids,
                    index=positions(in_ids, given),
                    has_const=folded is not None)

  def _kernel(path: str, in_ids: np.ndarray, out_ids: np.ndarray
              ) -> np.ndarray:
    """The kernel's rows ``in_ids``, zero where the channel is not used."""
    w = layers[path].kernel[:, :, in_ids][..., out_ids].copy()
    w[:, :, ~used[path][in_ids]] = 0  # constant (folded) or rounding
    return w

  def _folded(path: str, out_ids: np.ndarray) -> np.ndarray | None:
    """Sum over constant inputs of ``k_c * W[:, :, c, kept]``, or None."""
    layer = layers[path]
    cs = np.flatnonzero(const[path])
    if not len(cs) or not len(out_ids):
      return None
    w = layer.kernel[:, :, cs][..., out_ids].astype(np.float64)
    values = const_value[path][cs].astype(np.float64)
    folded = np.einsum("hwco,c->hwo", w, values)[:, :, None, :]
    if not np.any(folded):
      return None
    return folded.astype(layer.kernel.dtype)

  stem_spec = conv("stem", np.arange(spaces["image"].size))
  block_specs = []
  for name, _, _, _, projection in blocks:
    readers = [f"{name}/conv1"] + ([f"{name}/shortcut"] if projection else [])
    bn1, pre = norm(f"{name}/bn1", readers)
    bn2, mid = norm(f"{name}/bn2", [f"{name}/conv2"])
    shortcut = (conv(f"{name}/shortcut", pre) if projection
                else "identity" if skip else "none")
    block_specs.append(BlockSpec(
        name=name, bn1=bn1, conv1=conv(f"{name}/conv1", pre), bn2=bn2,
        conv2=conv(f"{name}/conv2", mid), shortcut=shortcut))
  bn_final, feats = norm("bn_final", ["head"])
  head_ids = np.flatnonzero(reads["head"])
  w = head["kernel"]
  bias = head["bias"].astype(np.float64)
  cs = np.flatnonzero(const["head"])
  if len(cs):
    # The mean over positions of a constant is that constant.
    bias = bias + const_value["head"][cs].astype(np.float64) @ w[cs].astype(
        np.float64)
  set_tree(out_params, "head/kernel", _kernel("head", head_ids,
                                              np.arange(w.shape[1]))[0, 0])
  set_tree(out_params, "head/bias", bias.astype(head["bias"].dtype))
  head_spec = DenseSpec(in_full=w.shape[0], in_channels=head_ids,
                        features=w.shape[1],
                        index=positions(head_ids, feats))
  mean, std = config.get("mean"), config.get("std")
  depth, width = int(config.get("depth", 20)), int(config.get("width", 1))
  spec = NetSpec(
      stem=stem_spec, blocks=tuple(block_specs), bn_final=bn_final,
      head=head_spec, mean=None if mean is None else tuple(mean),
      std=None if std is None else tuple(std),
      noise_coef=float(config.get("noise_coef", 0.0)) if noised else 0.0,
      noise_std_over=config.get("noise_std_over", "batch"),
      source=f"ResNet{depth}" + (f"x{width}" if width != 1 else "")
      + ("" if skip else " (no skip)"))
  return spec, {"params": out_params, "batch_stats": out_stats}
