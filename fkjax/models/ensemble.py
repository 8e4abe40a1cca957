"""EnResNet: an ensemble of noise-injected ResNets whose logits are averaged."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fkjax.models.resnet import PreActResNet


class EnResNet(nn.Module):
  """``num_members`` independently initialised :class:`PreActResNet` members.

  The members run as one batched computation: ``nn.vmap`` stacks every
  parameter and BatchNorm statistic on a leading member axis (a conv kernel
  is ``(members, H, W, I, O)``) and splits the ``'params'`` and ``'noise'``
  PRNG streams, so members are initialised and perturbed independently.

  Attributes:
    num_members: ensemble size ``n`` of En_nResNet.
    member_kwargs: attributes of each member (see :class:`PreActResNet`).
  """
  num_members: int = 2
  member_kwargs: dict[str, Any] | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False,
               add_noise: bool = True) -> jax.Array:
    """Mean over members of their logits, shape ``(batch, num_classes)``."""
    members = nn.vmap(
        PreActResNet,
        variable_axes={"params": 0, "batch_stats": 0},
        split_rngs={"params": True, "noise": True},
        in_axes=(None, None, None),
        out_axes=0,
        axis_size=self.num_members,
    )(**(self.member_kwargs or {}), name="members")
    return jnp.mean(members(x, train, add_noise), axis=0)
