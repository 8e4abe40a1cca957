"""Cost of drawing the injected noise: 2 M standard normals, several ways.

  python -m benchmarks.experiments.noise_draws
"""
from __future__ import annotations

import jax
from jax import lax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np

from benchmarks.experiments.common import median_ms
from fkjax import kernels

SIZE = 128 * 32 * 32 * 16  # one stage-1 block output of ResNet20, batch 128


def normal_hash_once(key: jax.Array, size: int) -> jax.Array:
  """Normals from threefry hashing each counter once for two 32-bit words."""
  k = jax.random.key_data(key)
  counts = lax.iota(jnp.uint32, (size + 1) // 2)
  a, b = jex_random.threefry2x32_p.bind(k[0], k[1], jnp.zeros_like(counts),
                                        counts)
  bits = jnp.stack([a, b], -1).reshape(-1)[:size]
  unit = lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000),
                                  jnp.float32) - 1.0
  lo = np.nextafter(np.float32(-1), np.float32(1))
  return np.float32(np.sqrt(2)) * lax.erf_inv(jnp.maximum(lo, 2 * unit - 1))


def main() -> None:
  kernels.apply_xla_flags()  # before JAX starts its backend
  key = jax.random.key(0)
  draws = {
      "jax.random.normal (threefry, default)":
          (lambda k: jax.random.normal(k, (SIZE,)), key),
      "jax.random.bits (threefry, default)":
          (lambda k: jax.random.bits(k, (SIZE,), jnp.uint32), key),
      "threefry hashed once per two words":
          (lambda k: normal_hash_once(k, SIZE), key),
      "jax.random.normal (philox4x32)":
          (lambda k: jax.random.normal(k, (SIZE,)),
           jax.random.key(0, impl="philox4x32")),
  }
  for name, (fn, k) in draws.items():
    print(f"{name}: {median_ms(jax.jit(fn), k, repeats=9):.2f} ms")
  sample = normal_hash_once(key, SIZE)
  print(f"hash-once sample: mean {float(sample.mean()):.4f}, "
        f"std {float(sample.std()):.4f}")


if __name__ == "__main__":
  main()
