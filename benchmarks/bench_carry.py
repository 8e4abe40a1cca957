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
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import jax
import numpy as np

from fkjax import checkpoint
from fkjax import experiment
from reproduce import carry
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
  model = experiment.create_model(config, 10)
  optimizer = experiment.create_optimizer(config, steps_per_epoch=352)
  state = jax.device_get(experiment.init_state(
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
  checkpointer = checkpoint.Checkpointer(workdir)
  checkpointer.save(352, state, val_accuracy=50.0)
  checkpointer.close()
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


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rows", default="table2/resnet20_rgsm_l0.1,"
                 "table2/en5resnet20_rgsm_l0.02")
  p.add_argument("--presets", default="0,1,3,6")
  p.add_argument("--pruned", type=float, default=0.5)
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
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
