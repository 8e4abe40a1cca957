"""The Feynman-Kac noise ``out + c * std(out) * z``, ``z ~ N(0, 1)``.

``z`` is Threefry-2x32 of the counters (example, position) under the key,
two 32-bit words per hash, each mapped to a normal by the inverse CDF as
``jax.random.normal`` does. An example's draws do not depend on its batch,
so batch-sharded runs draw the same numbers with no communication.

This is the one draw of fkjax: the hash is a parameter only so that a CPU
can run the same Threefry written out (``fkjax.kernels.cpu.threefry``, the
same bits, faster on XLA:CPU).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
from jax import lax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np


# Threefry-2x32 of a key's two words and an array of uint32 counters, as
# jax.extend.random.threefry_2x32.
Hash = Callable[[jax.Array, jax.Array], jax.Array]


def standard_normal(key: jax.Array, shape: Sequence[int],
                    dtype=jnp.float32, *,
                    threefry: Hash = jex_random.threefry_2x32) -> jax.Array:
  """N(0, 1) draws of ``shape``; the first axis (the batch) indexes counters.

  Keys of another PRNG implementation than the default ``threefry2x32``
  keep ``jax.random.normal``. ``threefry``: the hash, JAX's by default.
  """
  if jax.random.key_impl(key) != jax.random.key_impl(jax.random.key(0)):
    return jax.random.normal(key, shape, dtype)
  shape = tuple(shape)
  rows, cols = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
  half = (cols + 1) // 2
  row = lax.broadcasted_iota(jnp.uint32, (rows, half), 0)
  col = lax.broadcasted_iota(jnp.uint32, (rows, half), 1)
  # threefry_2x32 hashes the pairs (first half, second half) of its
  # flattened input: here (row, col).
  words = threefry(jax.random.key_data(key), jnp.stack([row, col]))
  bits = jnp.concatenate([words[0], words[1]], axis=1)[:, :cols]
  # 23 random mantissa bits -> uniform in [1, 2) -> [-1, 1); the clamp
  # keeps erf_inv finite.
  unit = lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000),
                                  jnp.float32) - 1.0
  lo = np.nextafter(np.float32(-1), np.float32(1))
  normal = np.float32(math.sqrt(2)) * lax.erf_inv(
      jnp.maximum(lo, 2.0 * unit - 1.0))
  return normal.reshape(shape).astype(dtype)


def inject_noise(out: jax.Array, coef: float, key: jax.Array,
                 std_over: str = "batch", *,
                 threefry: Hash = jex_random.threefry_2x32) -> jax.Array:
  """Returns ``out + coef * std(out) * standard_normal(key, out.shape)``.

  ``std_over="batch"`` takes one standard deviation over the whole tensor,
  as the authors' PyTorch code (``torch.std(out)``) does; ``"example"`` one
  per example, which makes each prediction independent of its batch.
  ``threefry``: the hash of :func:`standard_normal`.
  """
  if std_over == "batch":
    std = spread(out)
  elif std_over == "example":
    std = spread(out, axis=tuple(range(1, out.ndim)))
  else:
    raise ValueError(f"std_over must be 'batch' or 'example', got {std_over!r}")
  return out + coef * std * standard_normal(key, out.shape, out.dtype,
                                            threefry=threefry)


def spread(out: jax.Array, axis: tuple[int, ...] | None = None) -> jax.Array:
  """``jnp.std(out, axis)`` (axes kept), with no gradient where it is 0.

  The standard deviation is not differentiable at a constant tensor, and
  ``jnp.std``'s gradient there is NaN (so is ``torch.std``'s): a residual
  branch pruned to all zeros would turn training into NaNs. Such a group
  gets a zero gradient through its ``std``, as the fused CPU kernel
  (``fkjax.kernels.cpu.noise_cpu``) gives; elsewhere values and gradients are
  ``jnp.std``'s.
  """
  var = jnp.var(out, axis=axis, keepdims=axis is not None)
  nonzero = var > 0
  return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, var, 1.0)), 0.0)
