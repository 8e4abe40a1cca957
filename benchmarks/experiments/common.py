"""Timing helper shared by the experiments."""
from __future__ import annotations

import statistics
from typing import Any, Callable

import jax

from benchmarks import bench_train


def median_ms(fn: Callable[..., Any], *args, repeats: int = 7) -> float:
  """Median milliseconds of ``fn(*args)`` after one warm-up call."""
  run = lambda: jax.block_until_ready(fn(*args))
  seconds = bench_train.interleaved({"fn": run}, repeats, warmup=1)["fn"]
  return 1e3 * statistics.median(seconds)
