"""XLA flags that fkjax sets for itself, before JAX starts its backend.

XLA reads ``XLA_FLAGS`` once, when the first backend is created, which JAX does
lazily. Importing fkjax before running any JAX computation is therefore enough.

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

A flag the user already put in ``XLA_FLAGS`` always wins; ``FKJAX_NO_XLA_FLAGS=1``
disables all of this.
"""
from __future__ import annotations

import os

DEFAULT_CPU_FLAGS: dict[str, str] = {
    "--xla_cpu_experimental_ynn_fusion_type": "reduce",
    "--xla_cpu_enable_concurrency_optimized_scheduler": "false",
}


def apply_default_flags() -> None:
  """Adds fkjax's default XLA flags to ``XLA_FLAGS`` unless already set."""
  if os.environ.get("FKJAX_NO_XLA_FLAGS"):
    return
  current = os.environ.get("XLA_FLAGS", "")
  present = {item.split("=", 1)[0] for item in current.split()}
  extra = [f"{k}={v}" for k, v in DEFAULT_CPU_FLAGS.items() if k not in present]
  if extra:
    os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
