"""Micro-measurements behind docs/performance.md (fkjax only).

  python -m benchmarks.bench_variants noise --model en2resnet20 --batch 128
  python -m benchmarks.bench_variants cache --model en5resnet20 --batch 32

``noise``: time of one jitted forward pass (BatchNorm in eval mode) with the
injected noise drawn by each PRNG implementation, and without noise; the
difference is what drawing the noise costs.
``cache``: compile time of the PGD training step cold, then again after
``jax.clear_caches()`` with JAX's persistent compilation cache enabled (what a
second training process, or a resumed run, would pay).
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_train
from configs import default as default_config
from fkjax import argtypes
from fkjax.training import build
from fkjax import kernels
from fkjax.training import step as step_lib

PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def noise_cost(model_name: str, batch: int, repeats: int) -> dict[str, float]:
  """Forward-pass milliseconds per PRNG implementation and without noise."""
  config = default_config.get_config(model_name)
  images = jnp.asarray(np.random.default_rng(0).random(
      (batch, 32, 32, 3), dtype=np.float32))
  out = {}
  for label, coef, impl in ([("no noise", 0.0, "threefry2x32")]
                            + [(i, config.model.noise_coef, i)
                               for i in PRNG_IMPLS]):
    config.model.noise_coef = coef
    model = build.create_model(config, 10)
    key = jax.random.key(0, impl=impl)
    variables = jax.jit(functools.partial(model.init, train=False))(
        {"params": key, "noise": key}, images[:1])
    forward = jax.jit(lambda v, x, k, m=model: m.apply(
        v, x, train=False, rngs={"noise": k}))
    run = lambda f=forward, v=variables, k=key: f(v, images,
                                                  k).block_until_ready()
    seconds = bench_train.interleaved({label: run}, repeats, warmup=1)[label]
    out[label] = 1e3 * statistics.median(seconds)
  return out


def cache_compile(model_name: str, batch: int, unroll: str | None
                  ) -> dict[str, float]:
  """Cold compile seconds vs a persistent-cache hit, same process."""
  config = bench_train.fkjax_config(model_name, "pgd", batch, 10, 20, unroll)
  model = build.create_model(config, 10)
  optimizer = build.create_optimizer(config, steps_per_epoch=391)
  state = build.init_state(model, optimizer, jax.random.key(0))
  batch_arrays = jax.device_put(bench_train.random_batch(batch))
  key = jax.random.key(1)
  with tempfile.TemporaryDirectory() as cache_dir:
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    times = {}
    for label in ("cold", "persistent cache hit"):
      jax.clear_caches()
      step = jax.jit(step_lib.make_train_step(model, optimizer, config),
                     donate_argnums=(0,))
      start = time.perf_counter()
      step.lower(state, batch_arrays, key).compile()
      times[label] = time.perf_counter() - start
  return times


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("what", choices=["noise", "cache"])
  parser.add_argument("--model", default="en2resnet20")
  parser.add_argument("--batch", type=argtypes.positive_int, default=128)
  parser.add_argument("--repeats", type=argtypes.positive_int, default=5)
  parser.add_argument("--unroll", default=None)
  args = parser.parse_args(argv)
  kernels.apply_xla_flags()  # before JAX starts its backend
  load = bench_train.load_average()
  if args.what == "noise":
    result = noise_cost(args.model, args.batch, args.repeats)
  else:
    result = cache_compile(args.model, args.batch, args.unroll)
  print(json.dumps({"what": args.what, "model": args.model,
                    "batch": args.batch, "unroll": args.unroll,
                    "load_before": load,
                    "load_after": bench_train.load_average(),
                    "result": result}))


if __name__ == "__main__":
  main()
