"""How many of NAttack's population members to evaluate at once.

``attacks.nattack(chunk="auto")`` evaluates its population ``chunk`` members
at a time; :func:`auto_chunk` picks the chunk from the device's free memory
and an estimate of one member's forward pass (:func:`forward_bytes`), which
traces the model and compiles nothing.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.extend import core as jax_core

from fkjax.attacks import common

# Population members evaluated at once where the device does not report its
# memory (a CPU), and the part of a device's free memory the population's
# forward passes may take elsewhere (the rest: the attack's own arrays,
# XLA's workspace; forward_bytes of ResNet20 at batch 100 was 32 MiB where
# XLA:CPU's compiled forward pass asked 57 MiB).
CPU_CHUNK = 10
MEMORY_FRACTION = 0.25


def auto_chunk(apply_fn: common.ApplyFn, variables: Any, images: jax.Array,
               key: jax.Array, population: int,
               device: jax.Device | None = None) -> int:
  """Population members to evaluate at once on ``device``'s memory.

  ``MEMORY_FRACTION`` of the device's free memory (``memory_stats()``:
  ``bytes_limit - bytes_in_use``) over one member's forward pass at this
  batch (:func:`forward_bytes`), between 1 and ``population``; where the
  device reports no memory (a CPU), ``CPU_CHUNK``.

  Args:
    apply_fn: the model, ``apply_fn(variables, images, key) -> logits``.
    variables, images, key: as :func:`fkjax.attacks.nattack` takes them
      (arrays or tracers; only their shapes are used).
    population: NAttack's population.
    device: default the first local device.
  """
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except (AttributeError, NotImplementedError, RuntimeError):
    stats = None
  if not stats or not stats.get("bytes_limit"):
    return min(CPU_CHUNK, population)
  free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
  member = forward_bytes(apply_fn, variables, images, key)
  return int(min(population, max(1, free * MEMORY_FRACTION // member)))


def forward_bytes(apply_fn: common.ApplyFn, variables: Any,
                  images: jax.Array, key: jax.Array) -> int:
  """An estimate of one forward pass's memory at this batch.

  The most bytes the pass's images and intermediate values hold at once,
  each freed after its last use in the traced program's order; the
  variables, shared by every member, are not counted. XLA's buffers differ
  (it fuses, pads and keeps workspaces): :data:`MEMORY_FRACTION` leaves
  room. Traces the model; compiles nothing.
  """
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
  closed = jax.make_jaxpr(apply_fn)(*jax.tree.map(spec, (variables, images,
                                                         key)))
  return _nbytes(closed.jaxpr.invars[-2]) + _peak_bytes(closed.jaxpr)


def _nbytes(var: Any) -> int:
  aval = var.aval
  dtype = getattr(aval, "dtype", None)
  if not hasattr(aval, "shape") or dtype is None:
    return 0
  itemsize = getattr(dtype, "itemsize", 4)
  size = 1
  for d in aval.shape:
    size *= int(d)
  return size * itemsize


def _peak_bytes(jaxpr: Any) -> int:
  """Peak bytes of the values ``jaxpr`` computes, freed after last use."""
  last_use: dict[Any, int] = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jax_core.Var):
        last_use[v] = i
  for v in jaxpr.outvars:
    if isinstance(v, jax_core.Var):
      last_use[v] = len(jaxpr.eqns)
  inputs = {v for v in (*jaxpr.invars, *jaxpr.constvars)}
  live = peak = 0
  for i, eqn in enumerate(jaxpr.eqns):
    inner = max((_peak_bytes(getattr(j, "jaxpr", j))
                 for j in jax_core.jaxprs_in_params(eqn.params)), default=0)
    out = sum(_nbytes(v) for v in eqn.outvars)
    peak = max(peak, live + inner + out)
    live += sum(_nbytes(v) for v in eqn.outvars if v in last_use)
    freed = {v for v in eqn.invars if isinstance(v, jax_core.Var)
             and last_use.get(v) == i and v not in inputs}
    live -= sum(_nbytes(v) for v in freed)
  return peak
