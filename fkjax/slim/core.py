"""``slim``: a pruned PreActResNet or EnResNet as a smaller dense network."""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
from jax import lax

from fkjax.models import PreActResNet
from fkjax.slim import analysis
from fkjax.slim.model import SlimEnResNet, SlimResNet
from fkjax.slim.spec import NetSpec

PyTree = Any

_MEMBER_FIELDS = ("depth", "num_classes", "width", "skip", "noise_coef",
                  "noise_std_over", "mean", "std")
# PreActResNet's defaults, for a member_kwargs that leaves them out.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PreActResNet)
             if f.name in _MEMBER_FIELDS}


def _member_config(model: nn.Module) -> dict[str, Any]:
  if hasattr(model, "num_members"):
    kwargs = dict(model.member_kwargs or {})
    return {k: kwargs.get(k, _DEFAULTS[k]) for k in _MEMBER_FIELDS}
  return {k: getattr(model, k) for k in _MEMBER_FIELDS}


def slim(model: nn.Module, variables: PyTree, *, noise: bool = True,
         multiple: int = 1, conv=lax.conv_general_dilated, inject=None
         ) -> tuple[SlimResNet | SlimEnResNet, dict[str, PyTree]]:
  """A smaller dense network computing what a channel-pruned one computes.

  Channels are removed where the pruned weights make them irrelevant (see
  :mod:`fkjax.slim.analysis`): an input channel a convolution reads only
  through zero weights, the output channel and BatchNorm entries that then
  feed nothing, a stream channel no block of its stage reads. Constant
  channels (exactly zero before a BatchNorm) are folded into the next layer.
  Nothing is approximated: the result equals the original in eval mode
  (``train=False``) to float rounding, noise included (same keys, same
  draws) when ``noise`` is True.

  Args:
    model: a :class:`fkjax.models.PreActResNet` or
      :class:`fkjax.models.EnResNet` (any ``conv``, ``noise_impl`` or
      ``member_execution``).
    variables: its ``{'params', 'batch_stats'}``, e.g. the sparse ``u`` of
      RGSM (``fkjax.sparsity.project``).
    noise: keep the noise injection. Its ``std(out)`` runs over every
      channel of a block's output, so those tensors keep their full width
      and only the convolutions' inputs and the blocks' inner channels
      shrink. ``False`` builds the deterministic network (the original with
      ``add_noise=False``), whose residual streams shrink too.
    multiple: round every width up to a multiple of this (and keep a
      layer whole when fewer than ``multiple`` channels would go): the
      extra channels are computed and read through zero weights, so the
      function is the same. Convolutions with odd channel counts, and the
      gathers in front of a layer that reads a subset, cost more per
      multiply-add on CPUs; 1 removes every channel it can.
    conv, inject: the convolution and noise injection of the slim model
      (see :class:`SlimResNet`); they change speed, not values.

  Returns:
    ``(slim_model, slim_variables)``: a :class:`SlimResNet` (or a
    :class:`SlimEnResNet` whose members have their own widths) and its
    variables. ``slim_model.apply(slim_variables, x, rngs={'noise': key})``
    gives ``model.apply(variables, x, train=False, rngs={'noise': key})``.
  """
  config = _member_config(model)
  params, stats = variables["params"], variables.get("batch_stats", {})
  if not hasattr(model, "num_members"):
    spec, v = analysis.slim_member(config, params, stats, keep_noise=noise,
                                   multiple=multiple)
    return SlimResNet(spec, conv, inject), v
  n = model.num_members
  specs, member_vars = [], {"params": {}, "batch_stats": {}}
  for m in range(n):
    take = lambda tree, m=m: jax.tree.map(lambda a: a[m], tree)
    spec, v = analysis.slim_member(config, take(params["members"]),
                                   take(stats["members"]), keep_noise=noise,
                                   multiple=multiple)
    specs.append(spec)
    member_vars["params"][f"member_{m}"] = v["params"]
    member_vars["batch_stats"][f"member_{m}"] = v["batch_stats"]
  return (SlimEnResNet(tuple(specs), model.member_execution, conv, inject),
          member_vars)


def specs_of(model: SlimResNet | SlimEnResNet) -> tuple[NetSpec, ...]:
  """The member specs of a slim model (one for a :class:`SlimResNet`)."""
  return (model.spec,) if isinstance(model, SlimResNet) else model.specs
