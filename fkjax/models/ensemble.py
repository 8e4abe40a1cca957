"""EnResNet: an ensemble of noise-injected ResNets whose logits are averaged."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fkjax.models.resnet import PreActResNet

# How an ensemble's members run; the one list fkjax.kernels and fkjax.slim
# take theirs from.
MEMBER_EXECUTIONS = ("batched", "sequential", "unrolled")


class _Summed(PreActResNet):
  """A member as a ``nn.scan`` body: adds its logits to the running total."""
  train: bool = False
  add_noise: bool = True

  def __call__(self, total: jax.Array, x: jax.Array):
    return total + PreActResNet.__call__(self, x, self.train,
                                         self.add_noise), None


class EnResNet(nn.Module):
  """``num_members`` independently initialised :class:`PreActResNet` members.

  Every parameter and BatchNorm statistic carries a leading member axis (a
  conv kernel is ``(members, H, W, I, O)``), and the ``'params'`` and
  ``'noise'`` PRNG streams are split per member, so members are initialised
  and perturbed independently. How the members run is a speed choice only
  (which is fastest where: :func:`fkjax.kernels.resolve`):

  * ``"batched"``: ``nn.vmap``, one computation over all members (their
    convolutions become grouped convolutions).
  * ``"sequential"``: ``nn.scan`` over the members as a loop, one ordinary
    network at a time; compile time does not grow with the members.
  * ``"unrolled"``: the same scan written out member after member.

  All three have the same variables (a checkpoint of one restores into the
  others) and compute the same function of them; ``"sequential"`` and
  ``"unrolled"`` also draw the same initialisation and noise from the same
  keys, ``"batched"`` draws others.

  Attributes:
    num_members: ensemble size ``n`` of En_nResNet.
    member_kwargs: attributes of each member (see :class:`PreActResNet`).
    member_execution: ``"batched"``, ``"sequential"`` or ``"unrolled"``.
  """
  num_members: int = 2
  member_kwargs: dict[str, Any] | None = None
  member_execution: str = "batched"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False,
               add_noise: bool = True) -> jax.Array:
    """Mean over members of their logits, shape ``(batch, num_classes)``."""
    kwargs = self.member_kwargs or {}
    variable_axes = {"params": 0, "batch_stats": 0}
    split_rngs = {"params": True, "noise": True}
    if self.member_execution == "batched":
      members = nn.vmap(
          PreActResNet, variable_axes=variable_axes, split_rngs=split_rngs,
          in_axes=(None, None, None), out_axes=0, axis_size=self.num_members,
      )(**kwargs, name="members")
      return jnp.mean(members(x, train, add_noise), axis=0)
    if self.member_execution in ("sequential", "unrolled"):
      unroll = self.num_members if self.member_execution == "unrolled" else 1
      members = nn.scan(
          _Summed, variable_axes=variable_axes, split_rngs=split_rngs,
          in_axes=nn.broadcast, length=self.num_members, unroll=unroll,
      )(**kwargs, train=train, add_noise=add_noise, name="members")
      zeros = jnp.zeros((x.shape[0], members.num_classes), x.dtype)
      total, _ = members(zeros, x)
      return total / self.num_members
    raise ValueError(f"member_execution must be one of {MEMBER_EXECUTIONS}, "
                     f"got {self.member_execution!r}")
