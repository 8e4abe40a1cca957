"""Timing helper shared by the experiments."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax


def median_ms(fn: Callable[..., Any], *args, repeats: int = 7) -> float:
  """Median milliseconds of ``fn(*args)`` after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)
