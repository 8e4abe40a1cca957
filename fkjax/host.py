"""The host CPU, named for results: model, cores and vector instructions.

XLA:CPU compiles for the CPU it runs on, so a CPU run's speed and the last
digits of its numbers depend on it (2 vCPUs without AVX-512 trained the cpu
scale's En2ResNet20 2-3x slower than 2 with it: docs/performance.md,
"CPUs without AVX-512").
Results name it beside the JAX devices
(:func:`fkjax.training.devices.describe_devices`).
"""
from __future__ import annotations

import os
import platform

# The widest vector instruction set a CPU has, as results name it.
ISAS = ("AVX-512", "AVX2", "no AVX2")


def _isa(flags: list[str]) -> str:
  if "avx512f" in flags:
    return "AVX-512"
  return "AVX2" if "avx2" in flags else "no AVX2"


def describe_cpu(cpuinfo: str | None = None, cores: int | None = None) -> str:
  """E.g. ``AMD EPYC, 2 cores, AVX2``.

  Args:
    cpuinfo: the text of ``/proc/cpuinfo`` (default: read it; where there
      is none, the platform's processor name and no instruction set).
    cores: the cores this process may use (default: its CPU affinity).
  """
  if cores is None:
    try:
      cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
      cores = os.cpu_count() or 1
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        cpuinfo = f.read()
    except OSError:
      cpuinfo = ""
  model, flags = "", None
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(":")
    key = key.strip()
    if key == "model name" and not model:
      model = value.strip()
    elif key == "flags" and flags is None:
      flags = value.split()
  model = model or platform.processor() or platform.machine() or "a CPU"
  parts = [model, f"{cores} core" + ("s" if cores != 1 else "")]
  if flags is not None:   # x86: the flags name the vector extensions
    parts.append(_isa(flags))
  return ", ".join(parts)


def isa_of(devices: str) -> str | None:
  """The instruction set a ``describe_devices`` label names, if any."""
  _, _, cpu = devices.partition("; ")
  last = cpu.rsplit(", ", 1)[-1]
  return last if last in ISAS else None
