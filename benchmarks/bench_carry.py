"""What packing a run's carried state costs, by xz preset (reproduce.carry).

Usage (from the repository root):
  python -m benchmarks.bench_carry [--rows=table2/resnet20_rgsm_l0.1,...]
      [--presets=0,1,3,6] [--pruned=0.5]

Each row's training state at the gpu scale (weights, batch statistics,
optimizer state: what a lease carries) is saved as a real checkpoint twice:

* ``dense``: every float array random-normal, the worst case (trained
  float32 weights and momenta compress hardly better);
* ``pruned``: the same with ``--pruned`` of every conv kernel's input
  channels zeroed in the weights (RGSM's pruned net; the optimizer state is
  left dense, so a real pruned state compresses at least as well).

Each is packed as :func:`reproduce.carry.pack` does at each preset and
unpacked again; one Markdown row per state and preset: bytes, and the
CPU-seconds of packing and unpacking. zstd is in the standard library from
Python 3.14 only (fkjax supports 3.11-3.13), so it is not measured.

``--lease=N`` then times the lease's whole pack (``python -m reproduce.lease
pack``, as ``benchmarks/gpu_reproduce.sh`` runs it after its deadline) with
N runs stopped mid-way, each holding the last row's dense state: what the
script's MARGIN must leave.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np

from fkjax import checkpoint
from fkjax.training import build
from reproduce import carry
from reproduce import queue as queue_lib
from reproduce import scales
from reproduce import tables
from reproduce import weights


def training_state(row_name: str, pruned: float, seed: int = 0
                   ) -> dict[str, Any]:
  """``row_name``'s (``table/row``) gpu-scale training state, its floats
  random-normal; with ``pruned`` > 0 that share of channels zeroed."""
  table, row = row_name.split("/")
  spec = tables.TABLES[table].row(row)
  config = scales.build_config(spec.presets, spec.overrides,
                               scales.SCALES["gpu"], seed)
  model = build.create_model(config, 10)
  optimizer = build.create_optimizer(config, steps_per_epoch=352)
  state = jax.device_get(build.init_state(
      model, optimizer, jax.random.PRNGKey(seed), jax.random.PRNGKey(1)))
  rng = np.random.default_rng(seed)

  def noise(x):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
      return x
    return (0.05 * rng.standard_normal(x.shape)).astype(x.dtype)
  state = jax.tree.map(noise, state)
  if pruned:
    state["params"] = weights.prune_channels(
        {"params": state["params"]}, pruned, seed)["params"]
  return state


def _bytes(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(d, n))
             for d, _, names in os.walk(folder) for n in names)


def measure(state: dict[str, Any], presets: list[int], tmp: str
            ) -> list[dict[str, float]]:
  """Saves ``state`` as a checkpoint in ``tmp`` and packs it at each
  preset: raw and packed bytes, CPU-seconds to pack and to unpack."""
  workdir = os.path.join(tmp, "w")
  _save(state, workdir)
  raw = _bytes(os.path.join(workdir, "checkpoints"))
  out = []
  for preset in presets:
    path = os.path.join(tmp, f"p{preset}{carry.SUFFIX}")
    start = time.process_time()
    size = carry.pack(workdir, path, preset=preset)
    pack_s = time.process_time() - start
    start = time.process_time()
    carry.unpack(path, os.path.join(tmp, f"u{preset}"))
    unpack_s = time.process_time() - start
    out.append({"preset": preset, "raw": raw, "bytes": size,
                "pack_s": pack_s, "unpack_s": unpack_s})
  return out


def _save(state: dict[str, Any], workdir: str) -> None:
  checkpointer = checkpoint.Checkpointer(workdir)
  checkpointer.save(352, state, val_accuracy=50.0)
  checkpointer.close()


def lease_pack(state: dict[str, Any], runs: int, tmp: str
               ) -> dict[str, Any]:
  """``python -m reproduce.lease pack`` on ``runs`` queued runs stopped
  with ``state``: its output line, wall and CPU seconds."""
  entries = queue_lib.default_entries()[:runs]
  queue = os.path.join(tmp, "results", queue_lib.QUEUE_FILE)
  queue_lib.write(queue, entries)
  for entry in entries:
    _save(state, entry.workdir(os.path.join(tmp, "w")))
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  proc = subprocess.run(
      [sys.executable, "-m", "reproduce.lease", "pack", f"--queue={queue}",
       f"--results={os.path.join(tmp, 'results')}",
       f"--root={os.path.join(tmp, 'w')}", f"--out={os.path.join(tmp, 'o')}"],
      capture_output=True, text=True, check=True)
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return {"manifest": json.loads(proc.stdout.splitlines()[0]), "wall": wall,
          "cpu": (after.ru_utime + after.ru_stime
                  - before.ru_utime - before.ru_stime)}


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rows", default="table2/resnet20_rgsm_l0.1,"
                 "table2/en5resnet20_rgsm_l0.02")
  p.add_argument("--presets", default="0,1,3,6")
  p.add_argument("--pruned", type=float, default=0.5)
  p.add_argument("--lease", type=int, default=0,
                 help="then time the lease's pack with this many runs")
  args = p.parse_args(argv)
  presets = [int(x) for x in args.presets.split(",")]
  print("| row | state | xz preset | raw MB | packed MB | ratio | "
        "pack CPU-s | unpack CPU-s |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for row in args.rows.split(","):
    for kind, share in (("dense", 0.0), (f"pruned {args.pruned:.0%}",
                                         args.pruned)):
      with tempfile.TemporaryDirectory() as tmp:
        for m in measure(training_state(row, share), presets, tmp):
          print(f"| {row} | {kind} | {m['preset']} | {m['raw'] / 1e6:.1f} | "
                f"{m['bytes'] / 1e6:.1f} | {m['bytes'] / m['raw']:.2f} | "
                f"{m['pack_s']:.1f} | {m['unpack_s']:.1f} |", flush=True)
  if args.lease:
    with tempfile.TemporaryDirectory() as tmp:
      got = lease_pack(training_state(row, 0.0), args.lease, tmp)
    m = got["manifest"]
    print(f"\nthe lease's pack, {args.lease} runs stopped with {row}'s "
          f"dense state: {len(m['carried'])} carried, {len(m['dropped'])} "
          f"dropped, {m['bytes'] / 1e6:.1f} MB, {got['wall']:.1f} s wall, "
          f"{got['cpu']:.1f} CPU-s (preset {carry.PRESET})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
