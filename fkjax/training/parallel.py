"""Data parallelism with ``jax.jit`` over a 1-D ``'data'`` device mesh.

The batch is sharded along its first axis, everything else is replicated; XLA
inserts the cross-device reductions (gradient mean, BatchNorm statistics over
the global batch), so the program is the single-device one. Multi-host runs
call :func:`initialize_distributed` first; each process then feeds its own
slice of every global batch (``fkjax.data`` slices by ``process_index``).
"""
from __future__ import annotations

from typing import Any, Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fkjax import data as data_lib
from fkjax.config import record as run_config

DATA_AXIS = "data"


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None,
                           auto: bool = False) -> None:
  """Starts multi-host JAX; a no-op for a single process.

  On clusters that JAX auto-detects (SLURM, TPU pods, ...) pass
  ``auto=True``; elsewhere give the coordinator ``host:port``, the number of
  processes and this process's id (the same address and count everywhere).
  """
  if not auto and coordinator_address is None and num_processes in (None, 1):
    return
  # Cross-process collectives of the CPU backend (used when testing on one
  # machine); GPU and TPU backends bring their own.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes,
                             process_id=process_id)
  # Gloo builds its communicator at the first collective and gives up if a
  # process is more than 30 s late; the processes are in step right after
  # initialize(), so build it now rather than after unequal start-up work.
  from jax.experimental import multihost_utils
  multihost_utils.sync_global_devices("fkjax: distributed start")


def make_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh named ``'data'`` over all (or the first ``num_devices``) devices."""
  devices = jax.devices()
  if num_devices is not None:
    if not 1 <= num_devices <= len(devices):
      raise run_config.ConfigError(
          f"config.num_devices={num_devices} is invalid: {len(devices)} "
          f"device{'s are' if len(devices) != 1 else ' is'} visible "
          f"({', '.join(sorted({d.platform for d in devices}))}); use at "
          f"most {len(devices)}, or 0 for all of them")
    devices = devices[:num_devices]
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Shards the leading (batch) axis over the mesh."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_size(global_batch_size: int, mesh: Mesh,
                     key: str = "config.training.batch_size") -> None:
  """Refuses a training batch that does not split evenly over the mesh
  (``key``: the setting that gives it). Evaluation batches need no such
  check: :func:`eval_batches` pads them."""
  if global_batch_size % mesh.size:
    raise run_config.ConfigError(
        f"{key}={global_batch_size} does not divide over the {mesh.size} "
        f"devices: use a multiple of {mesh.size}, or fewer devices "
        "(config.num_devices)")


def padded_rows(batch_size: int, mesh: Mesh) -> int:
  """``batch_size`` rounded up to a multiple of the mesh's devices."""
  return -(-batch_size // mesh.size) * mesh.size


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Places this process's slice of a global batch on the mesh.

  With one process the slice is the whole batch; with several, each passes
  its own contiguous slice and the result is the global array.
  """
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Puts every leaf of ``tree`` on all devices of the mesh."""
  return jax.device_put(tree, replicated(mesh))


def eval_batches(split: Any, batch_size: int, mesh: Mesh
                 ) -> Iterator[dict[str, jax.Array]]:
  """Padded, masked evaluation batches of ``split`` (an
  ``fkjax.data.Split``) split over the mesh, each process giving its slice.

  Any ``batch_size`` works on any number of devices: each batch holds
  ``batch_size`` examples (the last one fewer), padded to a multiple of the
  devices with rows whose ``mask`` is False, so the batches are those of one
  device. ``fkjax.evaluation.Evaluator`` computes on the real rows alone,
  still split over the devices.
  """
  for batch in data_lib.eval_batches(
      split, batch_size, rows=padded_rows(batch_size, mesh),
      process_index=jax.process_index(),
      process_count=jax.process_count()):
    yield shard_batch(batch, mesh)
