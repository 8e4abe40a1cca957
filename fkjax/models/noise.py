"""Standard normal draws for EnResNet's injected noise, at half the hashing.

``jax.random.normal`` with JAX's default (partitionable) Threefry hashes two
64-bit counters per 32-bit output word. An EnResNet draws a fresh normal for
every activation of every residual block in every forward pass (about
250 M per PGD-10 step of En2ResNet20 at batch 128), and on CPU the draw
was 30% of the step. :func:`standard_normal` runs the same Threefry-2x32
hash once per *pair* of outputs, keyed by the PRNG key, on counters
(example, position), and maps each 32-bit word to a normal by the inverse
CDF as ``jax.random.normal`` does. The hash is written out in ``jnp``
(:func:`threefry2x32`, bit for bit ``jax.extend.random.threefry2x32_p``):
on CPU the primitive lowers to a rolled loop whose carried buffers are
copied each round, while the written-out rounds fuse into one elementwise
kernel. The values
differ from ``jax.random.normal``'s but are as deterministic (same key, same
draws, on every backend) and, since an example's counters do not depend on
the batch size or on the device it runs on, batch-sharded runs draw the same
numbers with no communication.
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


def _words(key: jax.Array, rows: int, cols: int) -> jax.Array:
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
  """N(0, 1) draws of ``shape``, one Threefry hash per two of them.

  Args:
    key: a typed PRNG key with the default ``threefry2x32`` implementation.
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
  bits = _words(key, rows, cols)
  # 23 random mantissa bits -> uniform in [1, 2) -> [-1, 1), as
  # jax.random.uniform does; the clamp keeps erf_inv finite.
  unit = lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000),
                                  jnp.float32) - 1.0
  lo = np.nextafter(np.float32(-1), np.float32(1))
  normal = np.float32(math.sqrt(2)) * lax.erf_inv(
      jnp.maximum(lo, 2.0 * unit - 1.0))
  return normal.reshape(shape).astype(dtype)
