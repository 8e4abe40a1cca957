"""Host input-pipeline throughput: augmentation + batching per batch.

Usage:
  python -m benchmarks.bench_data [--source synthetic|cifar_binary]
      [--data_dir DIR] [--batch_size 128] [--batches 200]
  (from the repository root)

Prints one table row per stage with the mean and median milliseconds per
batch. For scale: one PGD-10 training step of ResNet20 at batch 128 takes
about 4 s on the 2-core CPU this project is developed on.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

from fkjax import argtypes
from fkjax import data
from fkjax.data import augmentation


def _time(fn: Callable[[int], object], repeats: int) -> list[float]:
  fn(0)  # warm caches and allocator
  out = []
  for i in range(repeats):
    start = time.perf_counter()
    fn(i)
    out.append((time.perf_counter() - start) * 1e3)
  return out


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--source", default="synthetic",
                      choices=["synthetic", "cifar_binary"])
  parser.add_argument("--data_dir", default=None,
                      help="for cifar_binary; default $FKJAX_DATA_DIR")
  parser.add_argument("--batch_size", type=argtypes.positive_int, default=128)
  parser.add_argument("--batches", type=argtypes.positive_int, default=200)
  args = parser.parse_args(argv)

  start = time.perf_counter()
  ds = data.load_dataset("cifar10", args.source, args.data_dir)
  load_s = time.perf_counter() - start
  train, b = ds.train, args.batch_size
  n = train.num_examples
  print(f"dataset: {ds.description}")
  print(f"load_dataset: {load_s:.2f} s; batch_size {b}; {args.batches} "
        "batches per row\n")

  rng = np.random.default_rng(0)
  idx = [rng.permutation(n)[:b] for _ in range(args.batches + 1)]
  gathered = train.images[idx[0]]

  rows = [
      ("gather (fancy index)", lambda i: train.images[idx[i]]),
      ("augment (crop+flip)",
       lambda i: data.augment(gathered, np.random.default_rng(i))),
      ("  of which draw params",
       lambda i: augmentation.draw_params(np.random.default_rng(i), b)),
      ("uint8 -> float32", lambda i: data.to_float(gathered)),
  ]

  def next_of(batches):
    # The generator does its work lazily, so timing next() times one batch.
    return lambda i: next(batches)

  rows.append(("train_batches (everything)",
               next_of(data.train_batches(train, b, seed=0, epoch=0))))
  rows.append(("eval_batches (everything)",
               next_of(data.eval_batches(ds.test, b))))

  repeats = min(args.batches, n // b - 1, ds.test.num_examples // b - 1)
  print(f"{'stage':<28}{'mean ms':>10}{'median ms':>11}{'img/s':>10}")
  for name, fn in rows:
    times = _time(fn, repeats)
    mean = statistics.fmean(times)
    print(f"{name:<28}{mean:>10.2f}{statistics.median(times):>11.2f}"
          f"{b / mean * 1e3:>10.0f}")
  print("\nfor scale: a PGD-10 ResNet20 step at batch 128 takes ~4000 ms on "
        "this CPU")


if __name__ == "__main__":
  main()
