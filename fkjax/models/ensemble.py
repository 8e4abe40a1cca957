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
  others), compute the same function of them and draw the same
  initialisation and noise from the same keys: a seed starts the same run
  on an accelerator (batched) as on a CPU (unrolled or sequential).

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
    if self.member_execution not in MEMBER_EXECUTIONS:
      raise ValueError(f"member_execution must be one of "
                       f"{MEMBER_EXECUTIONS}, got {self.member_execution!r}")
    kwargs = dict(self.member_kwargs or {}, train=train, add_noise=add_noise,
                  name="members")
    # The variables are drawn by the scan whatever the execution: a batched
    # member's initialisation is the scanned member's (see _batched).
    if self.member_execution == "batched" and not self.is_initializing():
      members = _batched(self.num_members,
                         self.is_mutable_collection("batch_stats"))(**kwargs)
      total, _ = members(_zeros(x, members.num_classes), x)
      return jnp.mean(total, axis=0)
    unroll = self.num_members if self.member_execution == "unrolled" else 1
    members = nn.scan(
        _Summed, variable_axes=_VARIABLE_AXES, split_rngs=_SPLIT_RNGS,
        in_axes=nn.broadcast, length=self.num_members, unroll=unroll,
    )(**kwargs)
    total, _ = members(_zeros(x, members.num_classes), x)
    return total / self.num_members


_VARIABLE_AXES = {"params": 0, "batch_stats": 0}
# The 'params' and 'noise' streams are split per member.
_SPLIT_RNGS = {"params": True, "noise": True}


def _zeros(x: jax.Array, num_classes: int) -> jax.Array:
  """The logits' running total before the first member."""
  return jnp.zeros((x.shape[0], num_classes), x.dtype)


def _batched(num_members: int, update_stats: bool) -> type[nn.Module]:
  """The members as one computation (``nn.vmap``) that draws the scanned
  members' keys.

  Each member is a one-step ``nn.scan`` of :class:`_Summed` inside the
  ``nn.vmap``: Flax traces a scan's body twice and counts each scope's key
  draws across both traces, so a scanned member's draws are not those of a
  plain ``nn.vmap`` body. Running each member through the same scan makes
  its noise keys those of the sequential and unrolled members (the vmap
  splits the streams as the outer scan does). ``unroll=0`` writes the one
  step out: no loop reaches XLA. Its parameters are the scan's broadcast
  variables, which would be drawn in the first trace: the initialisation
  runs the scanned form instead (:meth:`EnResNet.__call__`).
  ``update_stats``: whether the BatchNorm statistics are updated (carried
  through the step) or only read.
  """
  one = nn.scan(_Summed,
                variable_broadcast=("params",) if update_stats
                else ("params", "batch_stats"),
                variable_carry=("batch_stats",) if update_stats else (),
                split_rngs={"params": False, "noise": False},
                in_axes=nn.broadcast, length=1, unroll=0)
  return nn.vmap(one, variable_axes=_VARIABLE_AXES, split_rngs=_SPLIT_RNGS,
                 in_axes=(None, None), out_axes=0, axis_size=num_members)
