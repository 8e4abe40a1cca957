"""Which platform's selections apply: ``cpu``, ``gpu`` or ``tpu``.

The kernels (:func:`fkjax.kernels.resolve`) and the evaluation's progress
(``fkjax.evaluation.progress``) choose by platform. By default that is JAX's
backend; ``FKJAX_KERNELS_PLATFORM=gpu`` (or ``tpu``) makes a CPU run what a
GPU (TPU) would: the stock convolutions, the models' own noise, batched
ensemble members and progress between batches, so that the accelerators'
path is tested and timed on a CPU (``docs/performance.md``). It changes only
the programs fkjax builds, not where they run.
"""
from __future__ import annotations


import jax

from fkjax import environment

PLATFORM_ENV = "FKJAX_KERNELS_PLATFORM"
PLATFORMS = ("cpu", "gpu", "tpu")
# JAX's platform names -> the family whose selections they take.
_FAMILY = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu",
           "tpu": "tpu"}


def platform(backend: str | None = None) -> str:
  """``"cpu"``, ``"gpu"`` or ``"tpu"``: whose selections to take.

  Args:
    backend: a JAX platform name (``"cpu"``, ``"cuda"``, ``"gpu"``, ...);
      default ``$FKJAX_KERNELS_PLATFORM`` if set, else
      ``jax.default_backend()``. Another accelerator than these counts as a
      GPU.

  Raises:
    ValueError: ``FKJAX_KERNELS_PLATFORM`` not one of :data:`PLATFORMS`, or
      ``cpu`` where JAX runs on an accelerator (fkjax's CPU kernels run on
      CPUs only).
  """
  if backend is None:
    forced = environment.text(PLATFORM_ENV).lower()
    if forced:
      if forced not in PLATFORMS:
        raise ValueError(f"{PLATFORM_ENV}={forced!r}: one of {PLATFORMS}")
      if forced == "cpu" and jax.default_backend() != "cpu":
        raise ValueError(f"{PLATFORM_ENV}=cpu: fkjax's CPU kernels run on "
                         f"CPUs only, not on {jax.default_backend()!r}")
      return forced
    backend = jax.default_backend()
  return _FAMILY.get(backend.lower(), "gpu")
