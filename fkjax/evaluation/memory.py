"""Whether a batch fits in memory, asked before it is run.

``eval.batch_size=10000`` with IFGSM^20 under a 6 GiB limit was killed by
the kernel after 18 s without a word. A compiled program knows what it will
allocate (XLA's ``memory_analysis()``: its temporaries and outputs; its
arguments are already allocated); :func:`free_bytes` knows what the device
has left (a GPU's allocator limit less what is in use, said with what
that limit is, since another process's share of the card is not in it; on
the CPU the RAM
Linux calls available, and what the cgroup's limit leaves). :func:`check`
compares them before the program runs, and where it does not fit raises
:class:`BatchTooLarge`, a user's error said in one line, naming the
estimate, what is free and the largest batch that fits (from a second
compilation at half the batch: a program's memory grows linearly in its
batch).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import jax

# Of what is free, what a program may plan to use: XLA's estimate leaves out
# the allocator's fragmentation and the runtime's own buffers.
USABLE = 0.9
_GIB = 2 ** 30
# What a GPU's free memory means: the share JAX's allocator took for this
# process when it started, which another process on the card does not see.
GPU_SHARE = (
    " to this process: the share of the card JAX's allocator took at its "
    "start (XLA_PYTHON_CLIENT_MEM_FRACTION, 75% unless set, reserved at "
    "once unless XLA_PYTHON_CLIENT_PREALLOCATE=false), less what it holds; "
    "another process on the card (an eval.py beside a train.py) holds its "
    "own share, which this one cannot see: give both "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false, or fractions that add up to at "
    "most 1 (docs/install.md)")


class BatchTooLarge(ValueError):
  """A batch would need more memory than the device has free."""


def _meminfo_available(text: str | None = None) -> int | None:
  """``MemAvailable`` of ``/proc/meminfo`` in bytes."""
  if text is None:
    try:
      with open("/proc/meminfo") as f:
        text = f.read()
    except OSError:
      return None
  for line in text.splitlines():
    if line.startswith("MemAvailable:"):
      return int(line.split()[1]) * 1024
  return None


def _read_int(path: str) -> int | None:
  try:
    with open(path) as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None   # "max": no limit


def _cgroup_free(root: str = "/sys/fs/cgroup") -> int | None:
  """What this process's cgroup limit leaves (v2, else v1), or None."""
  for limit, usage in (("memory.max", "memory.current"),
                       ("memory/memory.limit_in_bytes",
                        "memory/memory.usage_in_bytes")):
    cap, used = (_read_int(os.path.join(root, limit)),
                 _read_int(os.path.join(root, usage)))
    # v1 says "no limit" with a number near 2**63.
    if cap is not None and used is not None and cap < 2 ** 60:
      return max(0, cap - used)
  return None


def free_bytes(device: Any | None = None) -> tuple[int | None, str]:
  """``(bytes free, where that comes from)`` on ``device`` (default the
  first); None where it cannot be told."""
  device = device or jax.devices()[0]
  if device.platform != "cpu":
    try:
      stats = device.memory_stats() or {}
    except Exception:  # pylint: disable=broad-except
      stats = {}
    if "bytes_limit" in stats:
      return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
              f"{device.device_kind} memory free" + (
                  GPU_SHARE if device.platform == "gpu" else ""))
    return None, ""
  found = [(v, why) for v, why in ((_meminfo_available(), "RAM available"),
                                   (_cgroup_free(), "the cgroup's limit"))
           if v is not None]
  if not found:
    return None, ""
  return min(found)


def needed_bytes(compiled: Any) -> int | None:
  """What running ``compiled`` allocates beyond its arguments (None where
  XLA does not say)."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if analysis is None:
    return None
  return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes
             - analysis.alias_size_in_bytes)


def largest_fitting(batch: int, need: int, half_need: int | None,
                    budget: int, multiple: int = 1) -> int:
  """The largest batch whose need, linear through ``(batch, need)`` and
  ``(batch // 2, half_need)``, is within ``budget``; a multiple of
  ``multiple`` (0: none fits)."""
  half = batch // 2
  if half_need is None or half < 1 or need <= half_need:
    per_image, fixed = need / batch, 0.0
  else:
    per_image = (need - half_need) / (batch - half)
    fixed = max(0.0, need - per_image * batch)
  fits = int((budget - fixed) // per_image) if budget > fixed else 0
  return max(0, min(batch - 1, fits) // multiple * multiple)


def _gib(n: float) -> str:
  return f"{n / _GIB:.1f} GiB"


def check(compiled: Any, batch: int, what: str, *, batch_key: str,
          at_half: Callable[[], Any] | None = None, multiple: int = 1,
          scale: int = 1, free: tuple[int | None, str] | None = None
          ) -> None:
  """Raises :class:`BatchTooLarge` where ``compiled`` (``what``, on a batch
  of ``batch`` images) needs more than :data:`USABLE` of the memory free.

  Args:
    compiled: a ``jax.stages.Compiled``.
    batch: its batch size.
    what: what it computes, for the message (``attack ifgsm20``).
    batch_key: the setting that sets ``batch``
      (``config.eval.batch_size``).
    at_half: compiles the same program at half the batch, for the largest
      batch that fits (called only when ``batch`` does not fit).
    multiple: batches must be multiples of this (the devices).
    scale: devices sharing the memory, each running its part of the
      program (XLA's estimate is one device's).
    free: ``free_bytes()``'s answer (default: asked now).
  """
  need = needed_bytes(compiled)
  need = None if need is None else need * scale
  available, where = free if free is not None else free_bytes()
  if need is None or available is None:
    return   # nothing to compare: run as before
  budget = int(available * USABLE)
  if need <= budget:
    return
  half_need = needed_bytes(at_half()) if at_half is not None else None
  half_need = None if half_need is None else half_need * scale
  fits = largest_fitting(batch, need, half_need, budget, multiple)
  advice = (f"the largest batch that fits is about {fits}: rerun with "
            f"--{batch_key}={fits}" if fits else
            "no batch fits: free memory, or use a device with more")
  raise BatchTooLarge(
      f"{batch_key}={batch}: {what} needs about {_gib(need)} for a batch of "
      f"{batch} images (XLA's estimate) but {_gib(available)} is free "
      f"({where}); {advice}")
