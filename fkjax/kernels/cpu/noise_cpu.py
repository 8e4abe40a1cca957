"""EnResNet's noise injection as one fused CPU kernel (``noise_cpu.cc``).

``x + coef * std(x) * z`` with ``z`` the draw of
:func:`fkjax.models.noise.standard_normal`, forward and backward each in two
passes over the activations, through XLA's FFI (``kernels.noise="fused"``;
about 2x the jnp form's speed). Part of fkjax's CPU library
(:mod:`fkjax.kernels.cpu.build`). A forward pass that will be differentiated
also writes ``z`` for the backward pass: one write costs less than drawing
it again (forward + backward at 128x32x32x16 took 0.47 of the jnp form's
time, against 0.63 when the backward pass drew z again).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fkjax.kernels.cpu import threefry
from fkjax.kernels.cpu.build import load


def _stats_shape(x: jax.Array, per_example: bool) -> tuple[int, int]:
  return (x.shape[0] if per_example else 1, 2)


def _forward(x, key_bits, coef, per_example, keep_z):
  """(y, z, stats); z is empty unless ``keep_z``."""
  y = jax.ShapeDtypeStruct(x.shape, jnp.float32)
  z = y if keep_z else jax.ShapeDtypeStruct((0,), jnp.float32)
  stats = jax.ShapeDtypeStruct(_stats_shape(x, per_example), jnp.float32)
  return jax.ffi.ffi_call(
      "fkjax_noise_inject_fwd", (y, z, stats),
      # An ensemble's members under nn.vmap: one call per member.
      vmap_method="sequential")(
          x, key_bits, coef=np.float32(coef), per_example=per_example)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _inject(x, key_bits, coef, per_example):
  return _forward(x, key_bits, coef, per_example, keep_z=False)[0]


def _inject_fwd(x, key_bits, coef, per_example):
  # Keeping z (one write) is cheaper than drawing it again.
  y, z, stats = _forward(x, key_bits, coef, per_example, keep_z=True)
  return y, (x, z, stats)


def _inject_bwd(coef, per_example, residuals, dy):
  x, z, stats = residuals
  dx = jax.ffi.ffi_call(
      "fkjax_noise_inject_bwd", jax.ShapeDtypeStruct(x.shape, jnp.float32),
      vmap_method="sequential")(
          dy, x, z, stats, coef=np.float32(coef),
          per_example=per_example)
  return dx, None


_inject.defvjp(_inject_fwd, _inject_bwd)


def supports(x: jax.Array, key: jax.Array) -> bool:
  """Whether :func:`fused` takes these: float32 with a batch axis and a
  default (``threefry2x32``) key."""
  return x.dtype == jnp.float32 and x.ndim >= 1 and threefry.is_threefry(key)


def inject_noise(out: jax.Array, coef: float, key: jax.Array,
                 std_over: str = "batch") -> jax.Array:
  """:func:`fkjax.models.noise.inject_noise`, fused where :func:`supports`.

  Other dtypes and keys take :func:`fkjax.kernels.cpu.threefry.inject_noise`.

  Raises:
    OneDnnUnavailable: fkjax's CPU library cannot be built or loaded here.
  """
  if std_over not in ("batch", "example"):
    raise ValueError(f"std_over must be 'batch' or 'example', got {std_over!r}")
  if not supports(out, key):
    return threefry.inject_noise(out, coef, key, std_over)
  return fused(out, coef, key, per_example=std_over == "example")


def fused(x: jax.Array, coef: float, key: jax.Array,
          per_example: bool = False) -> jax.Array:
  """``x + coef * std(x) * standard_normal(key, x.shape)``, fused.

  The same function as :func:`fkjax.models.noise.inject_noise` (values and
  gradients to float32 rounding). ``std`` is over the whole tensor, or over
  each example when ``per_example``; a group with zero spread gets no
  gradient through its ``std``.

  Raises:
    ValueError: ``x`` or ``key`` not as :func:`supports` needs.
    OneDnnUnavailable: fkjax's CPU library cannot be built or loaded here.
  """
  if not supports(x, key):
    raise ValueError("the fused noise kernel takes float32 activations with a "
                     f"batch axis and a threefry key, got {x.dtype}{x.shape} "
                     f"and {jax.random.key_impl(key)}")
  load()
  return _inject(x, jax.random.key_data(key), float(coef), bool(per_example))
