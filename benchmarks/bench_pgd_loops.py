"""Measures the loop forms of ``pgd`` on a small convnet: compile and run time.

    python -m benchmarks.bench_pgd_loops --batch 32 --steps 10 20 --repeats 3

The convnet (two 3x3 convolutions of 16 and 32 channels on 32x32x3, a dense
head) is written with ``jax.lax``: the attack's loop alone is timed, on a
model small enough for its cost to show (``docs/attacks.md``, "Loop form").
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp

from fkjax import argtypes
from fkjax import kernels
from fkjax.attacks import gradient


def _init_convnet(key: jax.Array, channels: int = 3, num_classes: int = 10):
  k1, k2, k3 = jax.random.split(key, 3)
  he = lambda k, shape, fan_in: jax.random.normal(k, shape) * (2 / fan_in)**0.5
  return {
      "conv1": he(k1, (3, 3, channels, 16), 9 * channels),
      "conv2": he(k2, (3, 3, 16, 32), 9 * 16),
      "dense": he(k3, (32, num_classes), 32),
  }


def _apply_convnet(params, images, key):
  del key  # deterministic
  dims = ("NHWC", "HWIO", "NHWC")
  h = jax.lax.conv_general_dilated(images, params["conv1"], (1, 1), "SAME",
                                   dimension_numbers=dims)
  h = jax.nn.relu(h)
  h = jax.lax.conv_general_dilated(h, params["conv2"], (2, 2), "SAME",
                                   dimension_numbers=dims)
  h = jax.nn.relu(h)
  return jnp.mean(h, axis=(1, 2)) @ params["dense"]


def measure(unroll, num_steps: int, batch: int, repeats: int) -> tuple[float,
                                                                       float]:
  """Returns (compile seconds, best run seconds) of one jitted PGD call."""
  key = jax.random.key(0)
  params = _init_convnet(key)
  images = jax.random.uniform(key, (batch, 32, 32, 3))
  labels = jnp.zeros((batch,), jnp.int32)
  attack = jax.jit(functools.partial(gradient.pgd, _apply_convnet,
                                     num_steps=num_steps, unroll=unroll))
  start = time.perf_counter()
  compiled = attack.lower(params, images, labels, key).compile()
  compile_s = time.perf_counter() - start
  compiled(params, images, labels, key).block_until_ready()  # warm-up
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    compiled(params, images, labels, key).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return compile_s, best


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=argtypes.positive_int, default=32)
  parser.add_argument("--steps", type=argtypes.positive_int, nargs="+",
                      default=[10, 20])
  parser.add_argument("--repeats", type=argtypes.positive_int, default=3)
  args = parser.parse_args(argv)
  kernels.apply_xla_flags()  # before JAX starts its backend
  print(f"backend={jax.default_backend()} batch={args.batch}")
  print("steps  unroll  compile_s  run_s  ms/step")
  for num_steps in args.steps:
    for unroll in (num_steps, 1, 2, 5):
      compile_s, run_s = measure(unroll, num_steps, args.batch, args.repeats)
      print(f"{num_steps:5d}  {str(unroll):6s}  {compile_s:9.2f}  "
            f"{run_s:5.3f}  {1e3 * run_s / num_steps:7.1f}")


if __name__ == "__main__":
  main()
