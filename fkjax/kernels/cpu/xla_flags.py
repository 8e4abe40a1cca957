"""XLA flags that make fkjax faster on CPU, set by the entry points.

XLA reads ``XLA_FLAGS`` once, when JAX starts its first backend (lazily, at
the first computation), so :func:`apply_xla_flags` must run before that:
``train.py``, ``eval.py`` and the reproduction runner
(``python -m reproduce``, its pilots) call it first thing; library
users who want the flags call it themselves. Importing fkjax sets nothing.

Defaults (each measured on XLA:CPU, see ``docs/performance.md``):

* ``--xla_cpu_experimental_ynn_fusion_type=reduce`` keeps YNNPACK for
  reductions only. Its default fusions made the weight-gradient convolution
  ~11x slower on CPU; its reductions are ~3x faster than XLA's loop fusions,
  which split the BatchNorm statistics into strided ``reduce-window``s
  (ResNet20 PGD-10 step 2379 -> 1903 ms with oneDNN convolutions).
* ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` orders the
  thunks for memory rather than for running independent ones side by side.
  On a few cores that overlap mostly makes the two members of an En2ResNet
  fight over them (each oneDNN call already uses every core): En2ResNet20
  PGD-10 step 4.21-4.36 s against 4.61-5.08 s, XLA's memory estimate
  585 MB against 733 MB; ResNet20 unchanged within this VM's noise.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import mmap
import os
import pathlib
import pkgutil
import sys
import warnings

from fkjax import environment

DEFAULT_CPU_FLAGS: dict[str, str] = {
    "--xla_cpu_experimental_ynn_fusion_type": "reduce",
    "--xla_cpu_enable_concurrency_optimized_scheduler": "false",
}

DISABLE_ENV = "FKJAX_NO_XLA_FLAGS"


def apply_xla_flags() -> list[str]:
  """Adds fkjax's CPU flags to ``XLA_FLAGS`` where they apply.

  Call it before JAX's first computation. It adds a flag of
  :data:`DEFAULT_CPU_FLAGS` only

  * if ``FKJAX_NO_XLA_FLAGS`` is unset or empty;
  * if ``XLA_FLAGS`` does not already set it (the user's value wins);
  * if JAX will start a CPU backend: ``JAX_PLATFORMS`` (or
    ``jax.config.jax_platforms``) names ``cpu`` first, or names nothing and
    no accelerator plugin (CUDA, ROCm, TPU) is installed;
  * if the installed jaxlib knows the flag (XLA aborts the process on a flag
    it does not know): its name is in jaxlib's shared libraries.

  Returns:
    The flags added (``--name=value``), often none.
  """
  if environment.enabled(DISABLE_ENV):
    return []
  current = os.environ.get("XLA_FLAGS", "")
  present = {item.split("=", 1)[0] for item in current.split()}
  wanted = {k: v for k, v in DEFAULT_CPU_FLAGS.items() if k not in present}
  if not wanted or not cpu_backend_expected():
    return []
  if _backends_started():
    warnings.warn("apply_xla_flags() called after JAX started its backends: "
                  "XLA_FLAGS is read only once, the flags would have no effect",
                  RuntimeWarning, stacklevel=2)
    return []
  known = known_to_jaxlib(tuple(k.lstrip("-") for k in wanted))
  extra = [f"{k}={v}" for k, v in wanted.items() if k.lstrip("-") in known]
  if extra:
    os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
  return extra


def cpu_backend_expected() -> bool:
  """Whether JAX's default backend will be the CPU, without starting it."""
  first = _configured_platforms().split(",")[0].strip().lower()
  if first:
    return first == "cpu"
  return not accelerator_plugin_installed()


def _configured_platforms() -> str:
  """``jax.config.jax_platforms`` if JAX is imported, else ``JAX_PLATFORMS``
  (JAX's platforms in priority order; empty: JAX chooses)."""
  jax = sys.modules.get("jax")
  configured = getattr(jax.config, "jax_platforms", None) if jax else None
  return configured or os.environ.get("JAX_PLATFORMS", "")


def accelerator_plugin_installed() -> bool:
  """Whether a JAX plugin for a GPU or TPU (or libtpu) is installed.

  Looks for modules of the ``jax_plugins`` namespace package and the
  ``jax_plugins`` entry points, where JAX finds its plugins, without
  importing them.
  """
  if importlib.util.find_spec("libtpu") is not None:
    return True
  spec = importlib.util.find_spec("jax_plugins")
  if spec is not None and spec.submodule_search_locations:
    if any(True for _ in pkgutil.iter_modules(
        list(spec.submodule_search_locations))):
      return True
  return bool(importlib.metadata.entry_points(group="jax_plugins"))


def _backends_started() -> bool:
  if "jax" not in sys.modules:
    return False
  try:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):  # another JAX version: assume not
    return False


def jaxlib_libraries() -> list[pathlib.Path]:
  """jaxlib's shared libraries (where XLA lives), largest first."""
  spec = importlib.util.find_spec("jaxlib")
  if spec is None or not spec.submodule_search_locations:
    return []
  files = [path for folder in spec.submodule_search_locations
           for path in pathlib.Path(folder).rglob("*.so*") if path.is_file()]
  return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


@functools.cache
def known_to_jaxlib(names: tuple[str, ...]) -> frozenset[str]:
  """The flag ``names`` (without ``--``) that jaxlib's libraries contain.

  XLA registers each flag under its name as a NUL-terminated string, so a
  flag a jaxlib knows is in its binary; one not found there would abort the
  process. Reading fails safe: what cannot be read counts as unknown.
  """
  remaining, found = set(names), set()
  for path in jaxlib_libraries():
    if not remaining:
      break
    try:
      with open(path, "rb") as f, mmap.mmap(f.fileno(), 0,
                                            access=mmap.ACCESS_READ) as data:
        for name in list(remaining):
          if data.find(name.encode() + b"\0") >= 0:
            found.add(name)
            remaining.discard(name)
    except (OSError, ValueError):  # unreadable, or empty (mmap of 0 bytes)
      continue
  return frozenset(found)
