"""Pre-activation ResNets for 32x32 images, with optional noise injection.

The Feynman-Kac formalism principled ResNet (Wang et al. 2019) injects
Gaussian noise after every residual block: ``out + c * std(out) * N(0, 1)``.
With ``noise_coef=0`` the network is a plain pre-activation ResNet and needs
no PRNG at all.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from fkjax.models import conv as conv_lib
from fkjax.models import noise as noise_lib

# He-normal with fan-out (PyTorch's kaiming_normal_(mode='fan_out')), which
# the reference implementations use for every convolution.
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
# PyTorch's default nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
dense_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def _onednn_conv(*args, **kwargs):
  # Imported on first use: building oneDNN's library is only for CPU runs
  # that ask for it.
  from fkjax import onednn  # pylint: disable=import-outside-toplevel
  return onednn.conv_general_dilated(*args, **kwargs)


CONV_IMPLS = {"explicit_grad": conv_lib.conv_general_dilated,
              "onednn": _onednn_conv,
              "xla": lax.conv_general_dilated}


def resolve_conv(impl: str) -> str:
  """A model's ``conv`` with ``"auto"`` resolved.

  ``"auto"`` is ``"onednn"`` on a CPU backend where fkjax's oneDNN library
  builds (a warning says why where it does not), else ``"explicit_grad"``.
  """
  if impl != "auto":
    if impl not in CONV_IMPLS:
      raise ValueError(f"conv must be 'auto' or one of {sorted(CONV_IMPLS)}, "
                       f"got {impl!r}")
    return impl
  if jax.default_backend() != "cpu":
    return "explicit_grad"
  from fkjax import onednn  # pylint: disable=import-outside-toplevel
  reason = onednn.unavailable_reason()
  if reason is not None:
    warnings.warn("conv='auto' falls back to XLA's convolutions (about 2x "
                  f"slower on CPU): {reason}", RuntimeWarning, stacklevel=2)
    return "explicit_grad"
  return "onednn"


NOISE_IMPLS = ("jnp", "fused")


def resolve_noise_impl(impl: str) -> str:
  """A model's ``noise_impl`` with ``"auto"`` resolved.

  ``"auto"`` is ``"fused"`` (:mod:`fkjax.onednn.noise_inject`, one CPU
  kernel forward and one backward, about 2x the jnp form's speed) on a CPU
  backend where fkjax's CPU library builds, else ``"jnp"``.
  """
  if impl != "auto":
    if impl not in NOISE_IMPLS:
      raise ValueError(f"noise_impl must be 'auto' or one of {NOISE_IMPLS}, "
                       f"got {impl!r}")
    return impl
  if jax.default_backend() != "cpu":
    return "jnp"
  from fkjax import onednn  # pylint: disable=import-outside-toplevel
  # resolve_conv's warning already says why when the library is missing.
  return "fused" if onednn.unavailable_reason() is None else "jnp"


def _conv(features: int, size: int, strides: int, impl: str, name: str
          ) -> nn.Conv:
  impl = resolve_conv(impl)
  return nn.Conv(features, (size, size), strides=(strides, strides),
                 padding=[(size // 2, size // 2)] * 2, use_bias=False,
                 kernel_init=conv_init, conv_general_dilated=CONV_IMPLS[impl],
                 name=name)


def _batch_norm(train: bool, name: str | None = None) -> nn.BatchNorm:
  # PyTorch's BatchNorm2d defaults: running-average momentum 0.1, eps 1e-5.
  return nn.BatchNorm(
      use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)


def inject_noise(out: jax.Array, coef: float, key: jax.Array,
                 std_over: str = "batch", impl: str = "jnp") -> jax.Array:
  """Returns ``out + coef * std(out) * N(0, 1)``.

  Args:
    out: activations, batch first.
    coef: the noise coefficient ``c``.
    key: PRNG key of the Gaussian draw
      (:func:`fkjax.models.noise.standard_normal`).
    std_over: ``"batch"`` takes one standard deviation over the whole tensor,
      as the authors' PyTorch code (``torch.std(out)``) does; ``"example"``
      takes one per example, which makes each prediction independent of the
      rest of its batch.
    impl: ``"jnp"``, ``"fused"`` (CPU only; for float32 activations and a
      threefry key, else ``"jnp"``) or ``"auto"`` (:func:`resolve_noise_impl`).
      The same values and gradients to float32 rounding.
  """
  if std_over not in ("batch", "example"):
    raise ValueError(f"std_over must be 'batch' or 'example', got {std_over!r}")
  if resolve_noise_impl(impl) == "fused":
    from fkjax.onednn import noise_inject  # pylint: disable=import-outside-toplevel
    if noise_inject.supports(out, key):
      return noise_inject.inject_noise(out, coef, key,
                                       per_example=std_over == "example")
  if std_over == "batch":
    std = jnp.std(out)
  elif std_over == "example":
    std = jnp.std(out, axis=tuple(range(1, out.ndim)), keepdims=True)
  noise = noise_lib.standard_normal(key, out.shape, out.dtype)
  return out + coef * std * noise


class PreActBlock(nn.Module):
  """BN-ReLU-conv3x3-BN-ReLU-conv3x3, plus the (projected) input if ``skip``."""
  features: int
  strides: int = 1
  skip: bool = True
  noise_coef: float = 0.0
  noise_std_over: str = "batch"
  conv: str = "auto"
  noise_impl: str = "auto"

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
      out = inject_noise(out, self.noise_coef, self.make_rng("noise"),
                         self.noise_std_over, self.noise_impl)
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
    noise_std_over: see :func:`inject_noise`.
    mean, std: per-channel input normalisation applied inside the model, so
      that inputs (and attacks) live in ``[0, 1]``. ``None`` disables it.
    conv: ``"auto"`` (default: :func:`resolve_conv`), ``"explicit_grad"``
      (:mod:`fkjax.models.conv`), ``"onednn"`` (CPU only,
      :mod:`fkjax.onednn`) or ``"xla"``: same values, different programs.
    noise_impl: how the noise is injected: ``"auto"`` (default:
      :func:`resolve_noise_impl`), ``"jnp"`` or ``"fused"`` (CPU only): same
      values to float32 rounding, different programs.
  """
  depth: int = 20
  num_classes: int = 10
  width: int = 1
  skip: bool = True
  noise_coef: float = 0.0
  noise_std_over: str = "batch"
  mean: Sequence[float] | None = CIFAR10_MEAN
  std: Sequence[float] | None = CIFAR10_STD
  conv: str = "auto"
  noise_impl: str = "auto"

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
            self.noise_std_over, self.conv, self.noise_impl,
            name=f"stage{stage + 1}_block{block + 1}",
        )(x, train, add_noise)
    x = nn.relu(_batch_norm(train, "bn_final")(x))
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, kernel_init=dense_init,
                    bias_init=nn.initializers.zeros, name="head")(x)
