"""The slim specs and variables of a :class:`fkjax.slim.liveness.Plan`.

Every layer's function returns its spec and its variables as a flat
``{"params/<path>": array, "batch_stats/<path>": array}``; :func:`layers`
nests them into Flax's trees. BatchNorms keep the channels their readers
gather; convolutions gather those, compute the kept channels of their output
and fold constant inputs into a ``const_kernel``; the classifier folds them
into its bias.
"""
from __future__ import annotations

from typing import Any, Sequence

from flax import traverse_util
import numpy as np

from fkjax.slim.graph import BlockLayout
from fkjax.slim.liveness import Plan
from fkjax.slim.spec import BlockSpec, ConvSpec, DenseSpec, NormSpec

PyTree = Any
Flat = dict[str, np.ndarray]


def positions(ids: np.ndarray, within: np.ndarray
              ) -> tuple[int, ...] | None:
  """Where channels ``ids`` sit in a tensor of channels ``within``
  (``None``: the tensor is ``ids``, in order)."""
  if len(ids) == len(within) and np.array_equal(ids, within):
    return None
  lookup = {int(c): i for i, c in enumerate(within)}
  return tuple(lookup[int(c)] for c in ids)


def norm_channels(plan: Plan, readers: Sequence[str]) -> np.ndarray:
  """The channels a BatchNorm keeps: those any of its readers gathers."""
  return np.flatnonzero(np.any([plan.reads[r] for r in readers], axis=0))


def norm_layer(plan: Plan, path: str, inp: str, ids: np.ndarray
               ) -> tuple[NormSpec, Flat]:
  """The BatchNorm at ``path`` on space ``inp``, over channels ``ids``."""
  bn = plan.graph.bns[path]
  flat = {f"params/{path}/scale": bn["scale"][ids],
          f"params/{path}/bias": bn["bias"][ids],
          f"batch_stats/{path}/mean": bn["mean"][ids],
          f"batch_stats/{path}/var": bn["var"][ids]}
  kept = np.flatnonzero(plan.keep[inp])
  return (NormSpec(full=plan.graph.spaces[inp].size, channels=ids,
                   index=positions(ids, kept)), flat)


def gathered_kernel(plan: Plan, path: str, in_ids: np.ndarray,
                    out_ids: np.ndarray) -> np.ndarray:
  """The kernel's rows ``in_ids`` and columns ``out_ids``, zero in the rows
  the layer does not use (constant, folded, or kept for rounding)."""
  w = plan.graph.layers[path].kernel[:, :, in_ids][..., out_ids].copy()
  w[:, :, ~plan.used[path][in_ids]] = 0
  return w


def folded_constants(plan: Plan, path: str, out_ids: np.ndarray
                     ) -> np.ndarray | None:
  """``sum_c k_c * W[:, :, c, out_ids]`` over the constant inputs ``c``, as
  a ``(size, size, 1, out)`` kernel; None when there is nothing to add."""
  layer = plan.graph.layers[path]
  cs = np.flatnonzero(plan.const[path])
  if not len(cs) or not len(out_ids):
    return None
  w = layer.kernel[:, :, cs][..., out_ids].astype(np.float64)
  values = plan.const_value[path][cs].astype(np.float64)
  folded = np.einsum("hwco,c->hwo", w, values)[:, :, None, :]
  if not np.any(folded):
    return None
  return folded.astype(layer.kernel.dtype)


def conv_layer(plan: Plan, path: str, given: np.ndarray
               ) -> tuple[ConvSpec, Flat]:
  """The convolution at ``path``, given the channels ``given`` of its input
  (original indices, in order)."""
  layer = plan.graph.layers[path]
  k = layer.kernel
  in_ids = np.flatnonzero(plan.reads[path])
  out_ids = np.flatnonzero(plan.keep[layer.out])
  flat = {f"params/{path}/kernel": gathered_kernel(plan, path, in_ids,
                                                   out_ids)}
  folded = folded_constants(plan, path, out_ids)
  if folded is not None:
    flat[f"params/{path}/const_kernel"] = folded
  return (ConvSpec(size=k.shape[0], strides=layer.strides,
                   in_full=k.shape[2], out_full=k.shape[3],
                   in_channels=in_ids, out_channels=out_ids,
                   index=positions(in_ids, given),
                   has_const=folded is not None), flat)


def head_layer(plan: Plan, given: np.ndarray) -> tuple[DenseSpec, Flat]:
  """The classifier, given ``bn_final``'s channels ``given``; constant
  features are folded into its bias (the mean over positions of a constant
  is that constant)."""
  head = plan.graph.layers["head"]
  w = head.kernel[0, 0]
  in_ids = np.flatnonzero(plan.reads["head"])
  bias = head.bias.astype(np.float64)
  cs = np.flatnonzero(plan.const["head"])
  if len(cs):
    bias = bias + plan.const_value["head"][cs].astype(np.float64) @ w[
        cs].astype(np.float64)
  flat = {"params/head/kernel": gathered_kernel(
              plan, "head", in_ids, np.arange(w.shape[1]))[0, 0],
          "params/head/bias": bias.astype(head.bias.dtype)}
  return (DenseSpec(in_full=w.shape[0], in_channels=in_ids,
                    features=w.shape[1], index=positions(in_ids, given)),
          flat)


def block_layer(plan: Plan, block: BlockLayout, skip: bool
                ) -> tuple[BlockSpec, Flat]:
  """A residual block: ``bn1`` feeds ``conv1`` and the projection, ``bn2``
  feeds ``conv2``."""
  name = block.name
  readers = [f"{name}/conv1"] + ([f"{name}/shortcut"] if block.projection
                                 else [])
  inp = plan.graph.layers[f"{name}/conv1"].inp
  pre = norm_channels(plan, readers)
  mid = norm_channels(plan, [f"{name}/conv2"])
  bn1, flat = norm_layer(plan, f"{name}/bn1", inp, pre)
  bn2, more = norm_layer(plan, f"{name}/bn2", f"{name}/mid", mid)
  flat.update(more)
  shortcut = "identity" if skip else "none"
  if block.projection:
    shortcut, more = conv_layer(plan, f"{name}/shortcut", pre)
    flat.update(more)
  conv1, more = conv_layer(plan, f"{name}/conv1", pre)
  flat.update(more)
  conv2, more = conv_layer(plan, f"{name}/conv2", mid)
  flat.update(more)
  return BlockSpec(name=name, bn1=bn1, conv1=conv1, bn2=bn2, conv2=conv2,
                   shortcut=shortcut), flat


def layers(plan: Plan, blocks: Sequence[BlockLayout], skip: bool
           ) -> tuple[dict[str, Any], dict[str, PyTree]]:
  """``(specs, variables)``: the ``stem, blocks, bn_final, head`` fields of a
  :class:`fkjax.slim.NetSpec`, and ``{'params', 'batch_stats'}``."""
  stem, flat = conv_layer(plan, "stem",
                          np.arange(plan.graph.spaces["image"].size))
  block_specs = []
  for block in blocks:
    spec, more = block_layer(plan, block, skip)
    block_specs.append(spec)
    flat.update(more)
  head_inp = plan.graph.layers["head"].inp
  feats = norm_channels(plan, ["head"])
  bn_final, more = norm_layer(plan, "bn_final", head_inp, feats)
  flat.update(more)
  head, more = head_layer(plan, feats)
  flat.update(more)
  variables = traverse_util.unflatten_dict(flat, sep="/")
  return (dict(stem=stem, blocks=tuple(block_specs), bn_final=bn_final,
               head=head),
          {"params": variables["params"],
           "batch_stats": variables.get("batch_stats", {})})
