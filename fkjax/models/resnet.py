"""Pre-activation ResNets for 32x32 images, with optional noise injection.

The Feynman-Kac formalism principled ResNet (Wang et al. 2019) injects
Gaussian noise after every residual block: ``out + c * std(out) * N(0, 1)``.
With ``noise_coef=0`` the network is a plain pre-activation ResNet and needs
no PRNG at all.
"""
from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from fkjax.models import noise

# He-normal with fan-out (PyTorch's kaiming_normal_(mode='fan_out')), which
# the reference implementations use for every convolution.
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
# PyTorch's default nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
dense_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def _conv(features: int, size: int, strides: int, conv: Callable, name: str
          ) -> nn.Conv:
  return nn.Conv(features, (size, size), strides=(strides, strides),
                 padding=[(size // 2, size // 2)] * 2, use_bias=False,
                 kernel_init=conv_init, conv_general_dilated=conv, name=name)


def _batch_norm(train: bool, name: str | None = None) -> nn.BatchNorm:
  # PyTorch's BatchNorm2d defaults: running-average momentum 0.1, eps 1e-5.
  return nn.BatchNorm(
      use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)


class PreActBlock(nn.Module):
  """BN-ReLU-conv3x3-BN-ReLU-conv3x3, plus the (projected) input if ``skip``."""
  features: int
  strides: int = 1
  skip: bool = True
  noise_coef: float = 0.0
  noise_std_over: str = "batch"
  conv: Callable = lax.conv_general_dilated
  inject_noise: Callable = noise.inject_noise

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, add_noise: bool) -> jax.Array:
    make_conv = lambda f, k, s, name: _conv(f, k, s, self.conv, name)
    pre = nn.relu(_batch_norm(train, "bn1")(x))
    out = make_conv(self.features, 3, self.strides, "conv1")(pre)
    out = nn.relu(_batch_norm(train, "bn2")(out))
    out = make_conv(self.features, 3, 1, "conv2")(out)
    if self.skip:
      if self.strides != 1 or x.shape[-1] != self.features:
        shortcut = make_conv(self.features, 1, self.strides, "shortcut")(pre)
      else:
        shortcut = x
      out = out + shortcut
    if self.noise_coef and add_noise:
      out = self.inject_noise(out, self.noise_coef, self.make_rng("noise"),
                              self.noise_std_over)
    return out


class PreActResNet(nn.Module):
  """Pre-activation ResNet of depth ``6n+2`` for 32x32 images.

  Attributes:
    depth: 20, 32, 38, 44, 56, 110, ... (``(depth - 2) % 6 == 0``).
    num_classes: number of logits.
    width: multiplier of the stage widths 16/32/64.
    skip: ``False`` removes every identity and shortcut path (the paper's
      "without skip connection" nets).
    noise_coef: ``c`` of the noise injected after every residual block; 0 is
      a deterministic ResNet.
    noise_std_over: ``"batch"`` or ``"example"``, see
      :func:`fkjax.models.noise.inject_noise`.
    mean, std: per-channel input normalisation applied inside the model, so
      that inputs (and attacks) live in ``[0, 1]``. ``None`` (the default,
      as in the authors' code and ``config.model.normalize``) disables it;
      :data:`CIFAR10_MEAN` and :data:`CIFAR10_STD` are CIFAR-10's.
    conv: the convolution, with ``lax.conv_general_dilated``'s signature.
    inject_noise: ``(out, coef, key, std_over) -> out + coef * std * z``.
      ``conv`` and ``inject_noise`` change how fast the model runs, not the
      function it computes (faster ones: :func:`fkjax.kernels.resolve`).
  """
  depth: int = 20
  num_classes: int = 10
  width: int = 1
  skip: bool = True
  noise_coef: float = 0.0
  noise_std_over: str = "batch"
  mean: Sequence[float] | None = None
  std: Sequence[float] | None = None
  conv: Callable = lax.conv_general_dilated
  inject_noise: Callable = noise.inject_noise

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False,
               add_noise: bool = True) -> jax.Array:
    """Logits of images ``x`` (NHWC, values in [0, 1]).

    Args:
      x: images.
      train: BatchNorm uses batch statistics and updates ``batch_stats``.
      add_noise: whether to inject noise (needs the ``'noise'`` PRNG stream
        when ``noise_coef > 0``). The paper's models keep it on at test time.
    """
    if (self.depth - 2) % 6 or self.depth < 8:
      raise ValueError(f"depth must be 6n+2 with n >= 1, got {self.depth}")
    blocks_per_stage = (self.depth - 2) // 6
    if self.mean is not None:
      x = (x - jnp.asarray(self.mean, x.dtype)) / jnp.asarray(self.std, x.dtype)
    x = _conv(16 * self.width, 3, 1, self.conv, "stem")(x)
    for stage, features in enumerate((16, 32, 64)):
      for block in range(blocks_per_stage):
        strides = 2 if stage > 0 and block == 0 else 1
        x = PreActBlock(
            features * self.width, strides, self.skip, self.noise_coef,
            self.noise_std_over, self.conv, self.inject_noise,
            name=f"stage{stage + 1}_block{block + 1}",
        )(x, train, add_noise)
    x = nn.relu(_batch_norm(train, "bn_final")(x))
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, kernel_init=dense_init,
                    bias_init=nn.initializers.zeros, name="head")(x)
