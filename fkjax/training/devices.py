"""The devices a run computes on: named for its results, and the folder
their compiled programs are kept in between runs.

``train.py``, ``eval.py`` and the reproduction's tools call
:func:`enable_compilation_cache` before compiling anything; every result
file and log names the devices (:func:`describe_devices`).
"""
from __future__ import annotations

import os
import warnings

import jax
import ml_collections

from fkjax import host


def enable_compilation_cache(config: ml_collections.ConfigDict) -> str | None:
  """Turns on JAX's persistent compilation cache at
  ``config.compilation_cache_dir`` (used by train.py and eval.py).

  Leaves JAX alone when the user configured a cache (the
  ``JAX_COMPILATION_CACHE_DIR`` variable or ``jax.config``) or the config
  value is empty. The cache only saves time: a directory that cannot be
  written (a read-only home, say) gives a warning and no cache. Returns the
  cache directory in use, if any.
  """
  current = jax.config.jax_compilation_cache_dir
  if current or not config.get("compilation_cache_dir"):
    return current
  path = os.path.expanduser(config.compilation_cache_dir)
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, f".fkjax_write_probe_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    warnings.warn(f"compilation cache disabled: cannot write to {path} "
                  f"({e.strerror}); set config.compilation_cache_dir to a "
                  "writable folder (or '') to silence this", RuntimeWarning,
                  stacklevel=2)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  return path


def describe_devices(count: int | None = None) -> str:
  """E.g. ``1 x NVIDIA H200 (gpu), jax 0.11.2``: what a result was computed on.

  Kept with every result, since the same run's numbers differ in their last
  digits from one kind of machine (and XLA version) to another. On CPU the
  label names the host CPU too (``1 x cpu (cpu), jax 0.10.2; AMD EPYC, 2
  cores, AVX2``: :func:`fkjax.host.describe_cpu`). ``count``: the devices
  used (a mesh's size; default all).
  """
  devices = jax.devices()
  label = (f"{count or len(devices)} x {devices[0].device_kind} "
           f"({devices[0].platform}), jax {jax.__version__}")
  if devices[0].platform == "cpu":
    label += f"; {host.describe_cpu()}"
  return label

