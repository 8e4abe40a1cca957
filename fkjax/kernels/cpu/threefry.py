"""The model's noise with its Threefry hash written out in jnp (CPU).

:func:`fkjax.models.noise.standard_normal` draws an EnResNet's noise as
Threefry-2x32 of the counters (example, position), once per *pair* of
outputs (an EnResNet draws about 250 M normals per PGD-10 step of
En2ResNet20 at batch 128, and on CPU the draw was 30% of the step). JAX's
Threefry primitive lowers on XLA:CPU to a rolled loop whose carried buffers
are copied each round (on GPUs and TPUs to straight-line ``stablehlo``
operations, which is why only a CPU takes this). Here the 20 rounds are
written out as ``uint32`` operations (:func:`threefry_2x32`) that XLA fuses
into one elementwise kernel: the same bits (``tests/test_kernels_noise.py``),
faster. :func:`inject_noise` is the model's own noise with this hash
(``kernels.noise="jnp"``): the map from bits to normals is the model's, not
a copy.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from fkjax.models import noise as model_noise

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


def threefry_2x32(keypair: jax.Array, count: jax.Array) -> jax.Array:
  """``jax.extend.random.threefry_2x32``, written out: the same words.

  Hashes the pairs (first half, second half) of the flattened ``count``
  (an odd count gets a zero appended, its last word dropped, as JAX's).
  """
  flat = jnp.ravel(count).astype(jnp.uint32)
  odd = flat.size % 2
  if odd:
    flat = jnp.concatenate([flat, jnp.zeros((1,), jnp.uint32)])
  half = flat.size // 2
  x0, x1 = threefry2x32(keypair[0], keypair[1], flat[:half], flat[half:])
  out = jnp.concatenate([x0, x1])
  return (out[:-1] if odd else out).reshape(count.shape)


def is_threefry(key: jax.Array) -> bool:
  """Whether ``key`` uses JAX's default ``threefry2x32`` implementation."""
  return jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0))


def standard_normal(key: jax.Array, shape: Sequence[int],
                    dtype=jnp.float32) -> jax.Array:
  """:func:`fkjax.models.noise.standard_normal` with :func:`threefry_2x32`."""
  return model_noise.standard_normal(key, shape, dtype,
                                     threefry=threefry_2x32)


def inject_noise(out: jax.Array, coef: float, key: jax.Array,
                 std_over: str = "batch") -> jax.Array:
  """:func:`fkjax.models.noise.inject_noise` with :func:`threefry_2x32`."""
  return model_noise.inject_noise(out, coef, key, std_over,
                                  threefry=threefry_2x32)
