"""The model's noise injection with the Threefry hash written out in jnp.

:func:`fkjax.models.noise.standard_normal` draws an EnResNet's noise as
Threefry-2x32 of the counters (example, position), once per *pair* of
outputs (``jax.random.normal`` with JAX's default partitionable Threefry
hashes twice per output; an EnResNet draws about 250 M normals per PGD-10
step of En2ResNet20 at batch 128, and on CPU the draw was 30% of the step).
It calls JAX's Threefry primitive, which XLA:CPU lowers to a rolled loop
whose carried buffers are copied each round. Here the 20 rounds are written
out as ``uint32`` operations (:func:`threefry2x32`) that XLA fuses into one
elementwise kernel: the same bits (``tests/test_kernels_noise.py``), faster.
:func:`inject_noise` is the model's with this draw (``kernels.noise="jnp"``).
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 (20 rounds) of counters ``(x0, x1)`` under key ``(k0, k1)``.

  The same words as ``jax.extend.random.threefry2x32_p`` (Salmon et al.
  2011), as elementwise ``uint32`` operations that XLA fuses.
  """
  keys = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
  x0, x1 = x0 + keys[0], x1 + keys[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = x0 ^ ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r)))
    x0 = x0 + keys[(i + 1) % 3]
    x1 = x1 + keys[(i + 2) % 3] + jnp.uint32(i + 1)
  return x0, x1


def words(key: jax.Array, rows: int, cols: int) -> jax.Array:
  """``uint32[rows, cols]``: Threefry of counters (row, j), two words each."""
  half = (cols + 1) // 2
  k = jax.random.key_data(key)
  row = lax.broadcasted_iota(jnp.uint32, (rows, half), 0)
  col = lax.broadcasted_iota(jnp.uint32, (rows, half), 1)
  a, b = threefry2x32(k[0], k[1], row, col)
  return jnp.concatenate([a, b], axis=1)[:, :cols]


def is_threefry(key: jax.Array) -> bool:
  """Whether ``key`` uses JAX's default ``threefry2x32`` implementation."""
  return jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0))


def standard_normal(key: jax.Array, shape: Sequence[int],
                    dtype=jnp.float32) -> jax.Array:
  """:func:`fkjax.models.noise.standard_normal`, bit for bit.

  Args:
    key: a typed PRNG key; other implementations than the default
      ``threefry2x32`` keep ``jax.random.normal``.
    shape: output shape; its first axis (the batch) indexes the counters'
      first word, so an example's draws do not depend on the batch size.
    dtype: a float dtype of at most 32 bits.
  """
  if not is_threefry(key):
    # Another PRNG implementation: keep its own normal draw.
    return jax.random.normal(key, shape, dtype)
  shape = tuple(shape)
  rows = shape[0] if shape else 1
  cols = math.prod(shape[1:]) if shape else 1
  bits = words(key, rows, cols)
  # fkjax.models.noise's map, repeated on purpose: the speed layer imports
  # nothing from the models (tests/test_kernels.py), and the bit-equality
  # tests (tests/test_kernels_noise.py) keep the two the same.
  # 23 random mantissa bits -> uniform in [1, 2) -> [-1, 1), as
  # jax.random.uniform does; the clamp keeps erf_inv finite.
  unit = lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000),
                                  jnp.float32) - 1.0
  lo = np.nextafter(np.float32(-1), np.float32(1))
  normal = np.float32(math.sqrt(2)) * lax.erf_inv(
      jnp.maximum(lo, 2.0 * unit - 1.0))
  return normal.reshape(shape).astype(dtype)


def inject_noise(out: jax.Array, coef: float, key: jax.Array,
                 std_over: str = "batch") -> jax.Array:
  """:func:`fkjax.models.noise.inject_noise` with :func:`standard_normal`."""
  if std_over not in ("batch", "example"):
    raise ValueError(f"std_over must be 'batch' or 'example', got {std_over!r}")
  axis = None if std_over == "batch" else tuple(range(1, out.ndim))
  var = jnp.var(out, axis=axis, keepdims=axis is not None)
  # no gradient through a zero std (NaN in jnp.std), as the fused kernel
  nonzero = var > 0
  std = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, var, 1.0)), 0.0)
  return out + coef * std * standard_normal(key, out.shape, out.dtype)
