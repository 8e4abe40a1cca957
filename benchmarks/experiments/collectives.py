"""The all-reduces a data-parallel training step runs, per step.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
      python -m benchmarks.experiments.collectives --model resnet20 \\
      --devices 8 --batch-size 128 --attack-steps 10

Compiles the training step ``train.py`` runs over ``--devices`` devices
(``config.num_devices``: the batch split over them, ``sweep.shard=batch``)
and counts the all-reduces in XLA's partitioned program: each in the body
of a loop counts its trip count (the PGD attack's iterations), so the count
is what one step launches. BatchNorm's batch statistics are reduced over
the devices in every forward pass, the attack's included: the count grows
with the attack's iterations and the network's BatchNorm layers, not with
the batch. ``--shard runs`` counts a sweep of ``--devices`` runs, one per
device, instead. Prints one JSON line.

The count is the CPU compiler's; a GPU's (``XLA_FLAGS`` of a GPU build)
combines some neighbouring all-reduces into one launch, not across the
attack's iterations, which depend on each other.
"""
from __future__ import annotations

import argparse
import json
import re
from typing import Any

# `%name = ... all-reduce(` or `all-reduce-start(`; a computation's header
# `%name (...) -> ... {` or `ENTRY %name ...{`; a while's body and trip count.
_INSTRUCTION = re.compile(r"=\s*\S.*?\s(all-reduce(?:-start)?)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_WHILE = re.compile(r"\swhile\(.*body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CALLS = re.compile(
    r"(?:to_apply|calls|true_computation|false_computation|body|"
    r"condition)=%?([\w.\-]+)")


def _computations(hlo: str) -> dict[str, list[str]]:
  """``{computation name: its instruction lines}`` of an HLO module's text."""
  out: dict[str, list[str]] = {}
  current = None
  for line in hlo.splitlines():
    # headers start at the line's start; instructions are indented
    header = _COMPUTATION.match(line) if not line[:1].isspace() else None
    if header:
      current = header.group(1)
      out[current] = []
    elif current is not None:
      out[current].append(line)
  return out


_ARRAY = re.compile(r"\b(f64|f32|bf16|f16|s32|u32|s64|u64|pred|s8|u8)"
                    r"\[([\d,]*)\]")
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4,
          "bf16": 2, "f16": 2, "pred": 1, "s8": 1, "u8": 1}


def all_reduce_bytes(hlo: str) -> list[int]:
  """The bytes each all-reduce of an HLO module's text reduces (its result
  type's arrays, a tuple's summed), in the program's order."""
  out = []
  for line in hlo.splitlines():
    found = _INSTRUCTION.search(line)
    if not found:
      continue
    result_type = line[line.index("=") + 1:found.start(1)]
    total = 0
    for dtype, dims in _ARRAY.findall(result_type):
      n = 1
      for d in filter(None, dims.split(",")):
        n *= int(d)
      total += n * _BYTES[dtype]
    out.append(total)
  return out


def all_reduces_per_run(hlo: str) -> tuple[int, int]:
  """``(in the program's text, launched per run)``: all-reduces of an HLO
  module, the second counting each loop body its known trip count times."""
  comps = _computations(hlo)
  entry = next(m.group(1) for m in (
      _COMPUTATION.match(l) for l in hlo.splitlines() if l.startswith(
          "ENTRY")) if m)

  def dynamic(name: str, seen: tuple[str, ...] = ()) -> int:
    if name in seen or name not in comps:
      return 0
    total = 0
    for line in comps[name]:
      if _INSTRUCTION.search(line):
        total += 1
      loop = _WHILE.search(line)
      if loop:
        trip = _TRIP.search(line)
        total += (int(trip.group(1)) if trip else 1) * dynamic(
            loop.group(1), seen + (name,))
        continue
      for called in _CALLS.findall(line):
        total += dynamic(called, seen + (name,))
    return total

  static = sum(1 for lines in comps.values() for l in lines
               if _INSTRUCTION.search(l))
  return static, dynamic(entry)


def main() -> None:
  p = argparse.ArgumentParser(prog="python -m "
                              "benchmarks.experiments.collectives")
  p.add_argument("--model", default="resnet20")
  p.add_argument("--devices", type=int, default=8)
  p.add_argument("--batch-size", type=int, default=128)
  p.add_argument("--attack-steps", type=int, default=10)
  p.add_argument("--precision", default="float32")
  p.add_argument("--shard", choices=("batch", "runs"), default="batch")
  p.add_argument("--hlo-out", default=None,
                 help="also write the partitioned program's text here")
  args = p.parse_args()
  # pylint: disable=import-outside-toplevel
  import jax
  from benchmarks import gpu_bench_steps as steps
  from fkjax.training import sweep as sweep_lib
  if jax.device_count() < args.devices:
    raise SystemExit(
        f"error: {jax.device_count()} devices, --devices={args.devices}: "
        "set XLA_FLAGS=--xla_force_host_platform_device_count="
        f"{args.devices}")
  spec = steps.StepSpec(args.model, args.precision, "xla", args.attack_steps,
                        args.batch_size)
  runs = args.devices if args.shard == "runs" else 1
  configs = steps.sweep_configs(spec, runs)
  for config in configs:
    config.num_devices = args.devices
  sweep = sweep_lib.Runs.build(configs, shard=args.shard)
  state = sweep.initial_state()
  batch = sweep.place_batch(steps._host_batch(args.batch_size))  # pylint: disable=protected-access
  compiled = sweep.train_step.lower(
      state, batch, sweep.keys("train"), 0, sweep.placed_values()).compile()
  hlo = compiled.as_text()
  if args.hlo_out:
    with open(args.hlo_out, "w") as f:
      f.write(hlo)
  static, per_step = all_reduces_per_run(hlo)
  sizes = sorted(all_reduce_bytes(hlo))
  out: dict[str, Any] = {
      "model": args.model, "devices": args.devices, "shard": args.shard,
      "runs": runs, "batch_size": args.batch_size,
      "attack_steps": args.attack_steps, "precision": args.precision,
      "all_reduces_in_program": static, "all_reduces_per_step": per_step,
      "all_reduce_bytes_median": sizes[len(sizes) // 2] if sizes else None,
      "all_reduce_bytes_max": sizes[-1] if sizes else None,
      "platform": jax.devices()[0].platform}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
