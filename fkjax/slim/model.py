"""Flax modules of slim networks: per-layer widths from a :class:`NetSpec`.

:class:`SlimResNet` is an inference-only pre-activation ResNet whose every
layer has the widths its spec gives; :class:`SlimEnResNet` averages the
logits of members of different widths, run one after the other. Their
parameter trees use the original names (``stem``,
``stageS_blockB/{bn1,conv1,bn2,conv2,shortcut}``, ``bn_final``, ``head``;
members under ``member_M``), plus a ``const_kernel`` next to the ``kernel``
of a convolution that folds constant input channels.

The noise ``out + c * std(out) * N(0, 1)`` is drawn exactly as the original
model draws it: the same PRNG keys (the blocks keep their names, and an
ensemble derives its members' keys as :class:`fkjax.models.EnResNet` does),
the same Threefry counters (:func:`fkjax.models.noise.standard_normal`) and a
tensor of the same shape, because :func:`fkjax.slim.slim` keeps every
channel of a noise-injected tensor (its ``std`` is the noise scale).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from fkjax.models import MEMBER_EXECUTIONS
from fkjax.models import noise as noise_lib
from fkjax.slim.spec import ConvSpec, NetSpec

ConvFn = Callable[..., jax.Array]
# inject(out, coef, key, std_over) -> out + coef * std(out) * N(0, 1)
InjectFn = Callable[[jax.Array, float, jax.Array, str], jax.Array]
_DN = ("NHWC", "HWIO", "NHWC")


def _take(x: jax.Array, index: Sequence[int] | None) -> jax.Array:
  if index is None:
    return x
  return _gather(x, tuple(index), x.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather(x: jax.Array, index: tuple[int, ...], channels: int
            ) -> jax.Array:
  """``x[..., index]`` for distinct static channel indices."""
  del channels
  return x[..., np.asarray(index, np.int32)]


def _gather_fwd(x, index, channels):
  return _gather(x, index, channels), None


def _gather_bwd(index, channels, residuals, g):
  del residuals
  # The transpose of a gather is a scatter-add, which XLA:CPU runs slowly
  # (an attack's input gradient would cost more than the channels saved);
  # with distinct indices it is a gather from g plus a zero channel.
  inverse = np.full(channels, len(index), np.int32)
  inverse[np.asarray(index)] = np.arange(len(index))
  padded = jnp.concatenate([g, jnp.zeros((*g.shape[:-1], 1), g.dtype)], -1)
  return (padded[..., inverse],)


_gather.defvjp(_gather_fwd, _gather_bwd)


def _out_size(n: int, size: int, strides: int) -> int:
  pad = size // 2
  return (n + 2 * pad - size) // strides + 1


class SlimConv(nn.Module):
  """A :class:`ConvSpec` convolution: gather, convolve, add folded constants."""
  spec: ConvSpec
  conv: ConvFn = lax.conv_general_dilated

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    s = self.spec
    shape = (s.size, s.size, len(s.in_channels), len(s.out_channels))
    kernel = self.param("kernel", nn.initializers.zeros_init(), shape)
    x = _take(x, s.index)
    pad = [(s.size // 2, s.size // 2)] * 2
    strides = (s.strides, s.strides)
    if 0 in shape[2:]:
      # Every input channel pruned (or every output): only constants remain.
      out = jnp.zeros((x.shape[0], _out_size(x.shape[1], s.size, s.strides),
                       _out_size(x.shape[2], s.size, s.strides), shape[3]),
                      x.dtype)
    else:
      out = self.conv(x, kernel.astype(x.dtype), strides, pad,
                      dimension_numbers=_DN)
    if s.has_const:
      # A constant input channel through a zero-padded convolution: the same
      # convolution of a ones image (exact at the borders), batch size 1.
      const = self.param("const_kernel", nn.initializers.zeros_init(),
                         (s.size, s.size, 1, shape[3]))
      ones = jnp.ones((1, *x.shape[1:3], 1), x.dtype)
      out = out + lax.conv_general_dilated(ones, const.astype(x.dtype),
                                           strides, pad, dimension_numbers=_DN)
    return out


def _bn_relu(x: jax.Array, index, name: str) -> jax.Array:
  # PyTorch's BatchNorm2d epsilon, as the original; running statistics only.
  return nn.relu(nn.BatchNorm(use_running_average=True, epsilon=1e-5,
                              name=name)(_take(x, index)))


class SlimResNet(nn.Module):
  """An inference-only pre-activation ResNet with the widths of ``spec``.

  Attributes:
    spec: the architecture (:func:`fkjax.slim.slim` builds it).
    conv: the convolution, ``lax.conv_general_dilated``'s signature; e.g.
      ``fkjax.kernels.cpu.onednn_conv.conv_general_dilated`` on CPU or
      ``fkjax.kernels.cpu.explicit_grad_conv.conv_general_dilated`` for
      fast attack loops on CPU.
    inject: the noise injection, ``inject(out, coef, key, std_over)``;
      ``None`` is :func:`fkjax.models.noise.inject_noise`. Another
      implementation must draw the same normals to give the same function.
  """
  spec: NetSpec
  conv: ConvFn = lax.conv_general_dilated
  inject: InjectFn | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, add_noise: bool = True,
               noise_keys: Sequence[jax.Array] | None = None) -> jax.Array:
    """Logits of images ``x`` (NHWC, values in [0, 1]).

    Args:
      x: images.
      train: must be False: BatchNorm uses its running statistics, and the
        constants folded into the next layers assume so.
      add_noise: inject noise after every block (needs the ``'noise'`` PRNG
        stream, or ``noise_keys``, when ``spec.noise_coef > 0``).
      noise_keys: one key per block, instead of the ``'noise'`` stream
        (an ensemble passes its members' keys).
    """
    if train:
      raise ValueError("a slim network is for inference: its BatchNorm "
                       "constants were folded with the running statistics")
    s = self.spec
    if s.mean is not None:
      x = (x - jnp.asarray(s.mean, x.dtype)) / jnp.asarray(s.std, x.dtype)
    x = SlimConv(s.stem, self.conv, name="stem")(x)
    coef = s.noise_coef if add_noise else 0.0
    inject = self.inject or noise_lib.inject_noise
    for i, b in enumerate(s.blocks):
      key = None if noise_keys is None else noise_keys[i]
      x = _SlimBlock(b, self.conv, inject, name=b.name)(
          x, coef, s.noise_std_over, key)
    x = _bn_relu(x, s.bn_final.index, "bn_final")
    x = _take(jnp.mean(x, axis=(1, 2)), s.head.index)
    return _Head(s.head.features, name="head")(x)


class _Head(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.zeros_init(),
                        (x.shape[-1], self.features))
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
    return x @ kernel.astype(x.dtype) + bias.astype(x.dtype)


class _SlimBlock(nn.Module):
  spec: object
  conv: ConvFn
  inject: InjectFn

  @nn.compact
  def __call__(self, x, noise_coef, std_over, key):
    b = self.spec
    pre = _bn_relu(x, b.bn1.index, "bn1")
    out = SlimConv(b.conv1, self.conv, name="conv1")(pre)
    out = _bn_relu(out, b.bn2.index, "bn2")
    out = SlimConv(b.conv2, self.conv, name="conv2")(out)
    if isinstance(b.shortcut, ConvSpec):
      out = out + SlimConv(b.shortcut, self.conv, name="shortcut")(pre)
    elif b.shortcut == "identity":
      out = out + x
    if noise_coef:
      key = self.make_rng("noise") if key is None else key
      out = self.inject(out, noise_coef, key, std_over)
    return out


class _BlockKey(nn.Module):
  """Draws the key a block of this name draws: ``make_rng('noise')``."""

  @nn.compact
  def __call__(self):
    return self.make_rng("noise")


class _MemberKeys(nn.Module):
  """The noise keys of one member's blocks, under its block names."""
  block_names: tuple[str, ...]

  @nn.compact
  def __call__(self):
    return jnp.stack([_BlockKey(name=n)() for n in self.block_names])


class _ScannedKeys(_MemberKeys):
  """:class:`_MemberKeys` as an ``nn.scan`` body (EnResNet's sequential)."""

  def __call__(self, carry, x):
    del x
    return carry, _MemberKeys.__call__(self)


def member_noise_keys(block_names: Sequence[str], num_members: int,
                      member_execution: str, name: str = "members"
                      ) -> jax.Array:
  """Keys ``(members, blocks)`` that EnResNet's blocks draw, without its body.

  :class:`fkjax.models.EnResNet`'s members draw their keys as an ``nn.scan``
  over them under the name ``members`` splits the ``'noise'`` stream,
  whatever their ``member_execution``; the same scan of a module that only
  draws keys, called in the same place, returns the keys the original
  members' blocks used. Call it inside a module's ``nn.compact`` method.
  """
  if member_execution not in MEMBER_EXECUTIONS:
    raise ValueError(f"member_execution must be one of {MEMBER_EXECUTIONS}, "
                     f"got {member_execution!r}")
  probe = nn.scan(_ScannedKeys, variable_axes={}, split_rngs={"noise": True},
                  in_axes=nn.broadcast, length=num_members)
  _, keys = probe(tuple(block_names), name=name)(jnp.zeros(()), None)
  return keys


class SlimEnResNet(nn.Module):
  """Mean of the logits of slim members, each with its own widths.

  Members run one after the other (their widths differ, so they cannot be
  batched); their noise keys are those :class:`fkjax.models.EnResNet`'s
  members draw (the same under every ``member_execution``).

  Attributes:
    specs: one :class:`NetSpec` per member.
    member_execution: how the original ran its members (kept with the
      slim model; the keys do not depend on it).
    conv, inject: see :class:`SlimResNet`.
  """
  specs: tuple[NetSpec, ...]
  member_execution: str = "batched"
  conv: ConvFn = lax.conv_general_dilated
  inject: InjectFn | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False,
               add_noise: bool = True) -> jax.Array:
    """Mean over members of their logits, shape ``(batch, num_classes)``."""
    noisy = add_noise and any(s.noise_coef for s in self.specs)
    keys = None
    if noisy:
      names = [b.name for b in self.specs[0].blocks]
      keys = member_noise_keys(names, len(self.specs), self.member_execution)
    total = None
    for m, spec in enumerate(self.specs):
      logits = SlimResNet(spec, self.conv, self.inject, name=f"member_{m}")(
          x, train, add_noise, None if keys is None else keys[m])
      total = logits if total is None else total + logits
    return total / len(self.specs)
