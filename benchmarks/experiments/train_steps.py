"""fkjax train steps under model variants, interleaved in one process.

  python -m benchmarks.experiments.train_steps en2resnet20 pgd \
      batched,sequential,unrolled --repeats 3

Variants: a member_execution ("batched", "sequential", "unrolled"),
optionally with ":nonoise" (noise_coef 0). Batch 128, configs/default.py
presets otherwise.
"""
from __future__ import annotations

import argparse
import statistics
import time

import fkjax  # noqa: F401  (sets fkjax's XLA flags)
import jax
import numpy as np

from configs import default
from fkjax import train


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model")
  parser.add_argument("bench", choices=["clean", "pgd"])
  parser.add_argument("variants")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--batch", type=int, default=128)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  host = {"image": rng.random((args.batch, 32, 32, 3), dtype=np.float32),
          "label": rng.integers(0, 10, args.batch).astype(np.int32)}
  runs = {}
  for variant in args.variants.split(","):
    execution, _, extra = variant.partition(":")
    config = default.get_config(args.model)
    config.training.adversarial = args.bench == "pgd"
    config.model.member_execution = execution
    if extra == "nonoise":
      config.model.noise_coef = 0.0
    model = train.create_model(config, 10)
    optimizer = train.create_optimizer(config, 391)
    state = train.init_state(model, optimizer, jax.random.key(0))
    step = jax.jit(train.make_train_step(model, optimizer, config),
                   donate_argnums=(0,))
    start = time.perf_counter()
    compiled = step.lower(state, host, jax.random.key(1)).compile()
    memory = compiled.memory_analysis().temp_size_in_bytes / 2**20
    print(f"{variant}: compile {time.perf_counter() - start:.1f} s, "
          f"temporaries {memory:.0f} MB", flush=True)
    holder = {"state": state}

    def run(compiled=compiled, holder=holder):
      holder["state"], metrics = compiled(holder["state"],
                                          jax.device_put(host),
                                          jax.random.key(1))
      jax.block_until_ready(metrics)
    run()
    runs[variant] = run
  times = {name: [] for name in runs}
  for _ in range(args.repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      run()
      times[name].append(1e3 * (time.perf_counter() - start))
  for name, ts in times.items():
    print(f"{name}: median {statistics.median(ts):.0f} ms, min {min(ts):.0f}"
          f" ms, all {[round(t) for t in ts]}")


if __name__ == "__main__":
  main()
