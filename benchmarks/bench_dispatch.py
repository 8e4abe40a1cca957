"""Training throughput by data pipeline and steps per dispatch.

    python -m benchmarks.bench_dispatch [--model=resnet20] [--batch=128]
        [--attack_steps=10] [--steps=16] [--variants=host:1,host:8,device:1,device:8]

Times a single run's step program (``fkjax.training.train.train_program``, what
``train.py`` runs) on synthetic CIFAR-shaped data, for each ``pipeline:k``
variant: the first dispatch (compilation included), then ``--steps`` steps
after it (images per second). Also times the host's share of the two
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
  parser.add_argument("--variants", default="host:1,host:8,device:1,device:8")
  return parser.parse_args()


def _config(args, pipeline, k):
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config(args.model)
  config.dataset.source = "synthetic"
  n = args.batch * (args.steps + 2 * k + 1)
  config.dataset.synthetic_sizes = (n + 100, 100)
  config.dataset.val_size = 100
  config.training.batch_size = args.batch
  config.training.drop_last = True
  config.training.data_pipeline = pipeline
  config.training.steps_per_dispatch = k
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


def _time_variant(args, pipeline, k):
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax.training import dispatch, epoch_steps, experiment, train  # pylint: disable=import-outside-toplevel
  config = _config(args, pipeline, k)
  exp = experiment.Experiment.build(config)
  train_input = dispatch.TrainInput.build(config, exp.dataset.train)
  program = train.train_program(exp, config, train_input,
                                experiment.prng_key(0, "train"))
  feeds = train_input.feeds(0, 0)
  state = exp.initial_state()
  start = time.perf_counter()
  state, metrics = program(state, [next(feeds) for _ in range(k)], 0)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  ran = epoch_steps.run_epoch_steps(
      state, feeds, first_step=k, skip=0, steps_per_epoch=args.steps,
      step_fn=program, on_metrics=lambda step, m: {}, save=None,
      checkpoint_every=0, desc="", progress=False, steps_per_dispatch=k)
  return {"pipeline": pipeline, "steps_per_dispatch": k,
          "first_dispatch_s": first,
          "images_per_second": ran.images_per_second(args.batch),
          "device": experiment.describe_devices(1)}


def main():
  kernels.apply_xla_flags()  # as train.py does, before JAX starts
  args = _parse()
  print(json.dumps({"host": _host_costs(args.batch)}), flush=True)
  rows = []
  for variant in args.variants.split(","):
    pipeline, k = variant.split(":")
    row = _time_variant(args, pipeline, int(k))
    rows.append(row)
    print(json.dumps(row), flush=True)
  print(f"{args.model}, batch {args.batch}, PGD-{args.attack_steps}:")
  for row in rows:
    print(f"  {row['pipeline']:6s} k={row['steps_per_dispatch']:<2d} "
          f"first dispatch {row['first_dispatch_s']:6.1f} s, "
          f"{row['images_per_second']:8.1f} images/s")


if __name__ == "__main__":
  main()
