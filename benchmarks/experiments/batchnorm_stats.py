"""Channel statistics on XLA:CPU: one reduction vs two stages, alone and in
BatchNorm (forward and gradients), and a ResNet20's passes by BN mode.

  python -m benchmarks.experiments.batchnorm_stats
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks.experiments.common import median_ms
from fkjax import kernels
from fkjax.models import create_model


def channel_sum(x: jax.Array) -> jax.Array:
  """Sum over every axis but the last, as two reductions."""
  c = x.shape[-1]
  rows = x.size // c
  outer = next(n for n in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
               if rows % n == 0 and rows // n >= 8 or n == 1)
  return jnp.sum(jnp.sum(x.reshape(outer, rows // outer, c), 1), 0)


def flax_bn(x, scale, bias):
  bn = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
  variables = {"params": {"scale": scale, "bias": bias},
               "batch_stats": {"mean": jnp.zeros_like(scale),
                               "var": jnp.ones_like(scale)}}
  return bn.apply(variables, x, mutable=["batch_stats"])[0]


def two_stage_bn(x, scale, bias):
  m = x.size // x.shape[-1]
  mean = channel_sum(x) / m
  var = channel_sum(x * x) / m - mean ** 2
  return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def main() -> None:
  kernels.apply_xla_flags()  # before JAX starts its backend
  x = jax.random.normal(jax.random.key(0), (128, 32, 32, 16))
  m = x.size // x.shape[-1]
  one = jax.jit(lambda x: (jnp.mean(x, (0, 1, 2)), jnp.mean(x * x, (0, 1, 2))))
  two = jax.jit(lambda x: (channel_sum(x) / m, channel_sum(x * x) / m))
  print(f"channel mean and mean square of {x.shape}: one reduction each "
        f"{median_ms(one, x):.2f} ms, two stages {median_ms(two, x):.2f} ms")
  for shape in [(128, 32, 32, 16), (128, 16, 16, 32), (128, 8, 8, 64)]:
    x = jax.random.normal(jax.random.key(0), shape) * 2 + 1
    c = shape[-1]
    scale, bias = jnp.linspace(0.5, 1.5, c), jnp.linspace(-1, 1, c)
    r = jax.random.normal(jax.random.key(1), shape)
    for name, bn in (("flax", flax_bn), ("two-stage", two_stage_bn)):
      loss = lambda x, s, b, bn=bn: jnp.sum(jax.nn.relu(bn(x, s, b)) * r)
      print(f"{shape} {name}: forward "
            f"{median_ms(jax.jit(loss), x, scale, bias):.2f} ms, all grads "
            f"{median_ms(jax.jit(jax.grad(loss, (0, 1, 2))), x, scale, bias):.2f}"
            " ms")
  model = create_model(depth=20)
  x = jax.random.uniform(jax.random.key(0), (128, 32, 32, 3))
  labels = jnp.arange(128) % 10
  variables = jax.jit(model.init)({"params": jax.random.key(1)}, x)
  for train in (False, True):
    def loss(params, x, train=train):
      v = {**variables, "params": params}
      logits = (model.apply(v, x, True, mutable=["batch_stats"])[0] if train
                else model.apply(v, x))
      return jnp.sum(jax.nn.log_softmax(logits)[jnp.arange(128), labels])
    p = variables["params"]
    print(f"ResNet20 BN {'train' if train else 'eval'}: forward "
          f"{median_ms(jax.jit(loss), p, x, repeats=5):.0f} ms, + input grad "
          f"{median_ms(jax.jit(jax.grad(loss, 1)), p, x, repeats=5):.0f} ms, "
          f"+ parameter grads "
          f"{median_ms(jax.jit(jax.grad(loss)), p, x, repeats=5):.0f} ms")


if __name__ == "__main__":
  main()
