"""Training throughput by data pipeline.

    python -m benchmarks.bench_dispatch [--model=resnet20] [--batch=128]
        [--attack_steps=10] [--steps=16] [--variants=host,device]

Times a single run's step program (``fkjax.training.program.Runs``'s
``step_program``, what ``train.py`` runs) on synthetic CIFAR-shaped data,
for each pipeline: the first step (compilation included), then ``--steps``
steps after it (images per second). Also times the host's share of the two
pipelines: building one batch in NumPy (host) and drawing one epoch's plan
of 45,000 images (both). Prints one JSON line per variant and a table.
"""
from __future__ import annotations

import argparse
import json
import time

from fkjax import kernels


def _parse():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="resnet20")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--attack_steps", type=int, default=10)
  parser.add_argument("--steps", type=int, default=16)
  parser.add_argument("--variants", default="host,device")
  return parser.parse_args()


def _config(args, pipeline):
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config(args.model)
  config.dataset.source = "synthetic"
  n = args.batch * (args.steps + 2)
  config.dataset.synthetic_sizes = (n + 100, 100)
  config.dataset.val_size = 100
  config.training.batch_size = args.batch
  config.training.drop_last = True
  config.training.data_pipeline = pipeline
  config.attack.num_steps = args.attack_steps
  config.num_devices = 1
  return config


def _host_costs(batch_size):
  import numpy as np  # pylint: disable=import-outside-toplevel
  from fkjax.data import batching, types  # pylint: disable=import-outside-toplevel
  n = 45_000
  split = types.Split(np.zeros((n, 32, 32, 3), np.uint8),
                      np.zeros(n, np.int32))
  start = time.perf_counter()
  batching.epoch_plan(n, batch_size, n // batch_size, seed=0, epoch=0)
  plan = time.perf_counter() - start
  batches = batching.train_batches(split, batch_size, seed=0, epoch=0)
  next(batches)
  start = time.perf_counter()
  for _ in range(20):
    next(batches)
  return {"epoch_plan_ms": 1e3 * plan,
          "host_batch_ms": 1e3 * (time.perf_counter() - start) / 20}


def _time_variant(args, pipeline):
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax.training import devices, input_pipeline, program, train  # pylint: disable=import-outside-toplevel
  config = _config(args, pipeline)
  runs = program.Runs.build([config])
  train_input = input_pipeline.TrainInput.build(config,
                                                runs.exps[0].dataset.train)
  step_fn = runs.step_program(train_input, runs.keys("train"),
                              runs.placed_values())
  feeds = train_input.feeds(0, 0)
  state = runs.initial_state()
  start = time.perf_counter()
  state, metrics = step_fn(state, next(feeds), 0)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  ran = train.epoch_steps(
      state, feeds, first_step=1, skip=0, steps_per_epoch=args.steps,
      step_fn=step_fn, on_metrics=lambda step, m: {}, save=None,
      checkpoint_every=0, desc="", progress=False)
  return {"pipeline": pipeline, "first_step_s": first,
          "images_per_second": ran.images_per_second(args.batch),
          "device": devices.describe_devices(1)}


def main():
  kernels.apply_xla_flags()  # as train.py does, before JAX starts
  args = _parse()
  print(json.dumps({"host": _host_costs(args.batch)}), flush=True)
  rows = []
  for pipeline in args.variants.split(","):
    row = _time_variant(args, pipeline)
    rows.append(row)
    print(json.dumps(row), flush=True)
  print(f"{args.model}, batch {args.batch}, PGD-{args.attack_steps}:")
  for row in rows:
    print(f"  {row['pipeline']:6s} "
          f"first step {row['first_step_s']:6.1f} s, "
          f"{row['images_per_second']:8.1f} images/s")


if __name__ == "__main__":
  main()
