"""N runs as one program (fkjax.training.sweep) against N runs one after another.

Usage (from the repository root):

  python -m benchmarks.bench_sweep --models resnet20 --runs 1,2,4 \
      --batch 32 --steps 2 --repeats 3                       # a CPU
  python -m benchmarks.bench_sweep --device gpu \
      --models resnet20,en2resnet20 --runs 1,2,4,8,16 --batch 128 \
      --steps 10 --repeats 10 --json sweep.json --md sweep.md   # a GPU

For each model and each N of ``--runs`` it builds N RGSM runs that differ
in their seed and lambda1 (``configs/default.py`` presets, synthetic
CIFAR-shaped data: speed does not depend on pixel values) and times

* the sweep's PGD-``--steps`` training step (``fkjax.training.program.Runs``:
  every run's ``step_lib.make_train_step`` stages under ``jax.vmap``, the
  weight gradient outside it: ``step_lib.over_runs``; state donated,
  one shared batch copied to the device inside every timed step);
* the single run's step (``step_lib.make_train_step`` jitted as
  ``train.train_and_evaluate`` jits it) for the first run: N runs one after
  another take N times its time, and compile N programs (their
  hyperparameters are constants of their programs).

The two alternate (``bench_train.interleaved``), so that outside load hits
both alike; medians over ``--repeats`` after ``--warmup``.

Reported: median step times (wall, and the process's CPU time, which
outside load on a shared machine disturbs less), aggregate images/s (N x
batch / step time)
against the single run's (batch / step time), the speed-up, compile times
(the sweep's one program; the sequential runs' N), the % of the float32
matmul peak (``bench_train.measure_peak``: numpy's on a CPU, ``jnp.dot`` at
JAX's default precision on a GPU), and the projected wall time of N whole
runs (``--epochs`` epochs of ``--steps-per-epoch`` steps, training steps
only) as one program and one after another.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import jax

from benchmarks import bench_train
from configs import default as default_config
from fkjax import argtypes
from fkjax.config import keys as config_keys
from fkjax.training import build
from fkjax import kernels
from fkjax.training import parallel
from fkjax.training import sweep as sweep_lib
from fkjax.training import step as step_lib
from fkjax.training import train
from fkjax.training.sweep import spec


def run_configs(model: str, num_runs: int, batch: int, pgd_steps: int,
                method: str = "rgsm") -> list[Any]:
  """N configs of ``model`` differing in seed and lambda1 (or lambda)."""
  configs = []
  for i in range(num_runs):
    c = default_config.get_config(f"{model},{method}")
    c.dataset.source = "synthetic"
    c.dataset.synthetic_sizes = (4 * batch, batch)
    c.dataset.val_size = batch
    c.training.batch_size = batch
    c.attack.num_steps = pgd_steps
    c.validation.batch_size = batch
    c.num_devices = 1
    c.progress = False
    c.seed = i
    key = "sparsity.lamb1" if method == "rgsm" else "sparsity.lamb"
    base = config_keys.get(c, key)
    config_keys.set_value(c, key, base * (1.0 + 0.5 * i))
    configs.append(c)
  return spec.with_data_seed(configs, "shared")


def _block(tree: Any) -> Any:
  return jax.block_until_ready(tree)


def prepare_sweep(configs) -> tuple[dict[str, Any], Any]:
  """Compile times of the sweep of ``configs``, and a runner of one step."""
  sweep = sweep_lib.Runs.build(configs)
  batch = next(iter(_batches(sweep.exps[0], configs[0])))
  state = sweep.initial_state()
  keys, values = sweep.keys("train"), sweep.placed_values()
  start = time.perf_counter()
  lowered = sweep.train_step.lower(state, sweep.place_batch(batch), keys, 0,
                                   values)
  lower_s = time.perf_counter() - start
  start = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state, "step": 0}

  def step():
    s, _ = compiled(holder["state"], sweep.place_batch(batch), keys,
                    holder["step"], values)
    holder["state"] = _block(s)
    holder["step"] += 1
  return {"lower_s": lower_s, "compile_s": compile_s,
          "memory_mb": _memory_mb(compiled)}, step


def prepare_single(config) -> tuple[dict[str, Any], Any]:
  """Compile time of one run alone, as train.py jits it, and a runner."""
  exp = build.Experiment.build(config)
  batch = next(iter(_batches(exp, config)))
  state = exp.initial_state()
  step_fn = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer, config),
                    donate_argnums=(0,))
  key = build.prng_key(config.seed, "train")
  start = time.perf_counter()
  compiled = step_fn.lower(state, parallel.shard_batch(batch, exp.mesh),
                           key).compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state}

  def step():
    s, _ = compiled(holder["state"], parallel.shard_batch(batch, exp.mesh),
                    key)
    holder["state"] = _block(s)
  return {"compile_s": compile_s, "memory_mb": _memory_mb(compiled)}, step


def _cpu_timed(step, into: list[float]):
  """``step``, appending each call's process CPU seconds to ``into``."""
  def timed():
    start = time.process_time()
    step()
    into.append(time.process_time() - start)
  return timed


def _batches(exp, config):
  from fkjax import data as data_lib  # pylint: disable=import-outside-toplevel
  return data_lib.train_batches(exp.dataset.train, config.training.batch_size,
                                seed=0, epoch=0, augment=False)


def _memory_mb(compiled) -> float | None:
  try:
    m = compiled.memory_analysis()
    return (m.temp_size_in_bytes + m.argument_size_in_bytes
            + m.output_size_in_bytes) / 2**20
  except Exception:  # pylint: disable=broad-except
    return None


def bench_model(model: str, runs: list[int], args, peak: float
                ) -> list[dict[str, Any]]:
  first = run_configs(model, 1, args.batch, args.steps)[0]
  members = first.model.ensemble_size
  macs = bench_train.forward_macs(first.model.depth)
  fwd = bench_train.forward_equivalents("pgd", args.steps, 0)
  single, single_step = prepare_single(first)
  rows = []
  for n in runs:
    load_before = bench_train.load_average()
    swept, sweep_step = prepare_sweep(run_configs(model, n, args.batch,
                                                  args.steps))
    # Alternating, so that outside load hits both alike.
    cpu = {"single": [], "sweep": []}
    times = bench_train.interleaved(
        {"single": _cpu_timed(single_step, cpu["single"]),
         "sweep": _cpu_timed(sweep_step, cpu["sweep"])}, args.repeats,
        args.warmup)
    swept["seconds"], single["seconds"] = times["sweep"], times["single"]
    # the timed calls' process CPU seconds (the warm-up calls' come first)
    sweep_cpu = statistics.median(cpu["sweep"][args.warmup:])
    single_cpu = statistics.median(cpu["single"][args.warmup:])
    single_s = statistics.median(single["seconds"])
    single_rate = args.batch / single_s
    sweep_s = statistics.median(swept["seconds"])
    rate = n * args.batch / sweep_s
    steps_total = args.epochs * args.steps_per_epoch
    row = {
        "model": model, "runs": n, "batch": args.batch,
        "pgd_steps": args.steps,
        "sweep_ms": 1e3 * sweep_s, "sweep_min_ms": 1e3 * min(swept["seconds"]),
        "sweep_times_ms": [round(1e3 * t, 1) for t in swept["seconds"]],
        "sweep_images_per_s": rate,
        "sweep_gflops": bench_train.gflops(macs, members, fwd,
                                           n * args.batch, sweep_s),
        "sweep_lower_s": swept["lower_s"],
        "sweep_compile_s": swept["compile_s"],
        "sweep_memory_mb": swept["memory_mb"],
        "single_ms": 1e3 * single_s,
        "single_times_ms": [round(1e3 * t, 1) for t in single["seconds"]],
        "single_images_per_s": single_rate,
        "single_compile_s": single["compile_s"],
        "sequential_compile_s": n * single["compile_s"],
        "speedup": rate / single_rate,
        "per_run_ratio": (sweep_s / n) / single_s,
        "sweep_cpu_ms": 1e3 * sweep_cpu, "single_cpu_ms": 1e3 * single_cpu,
        "per_run_cpu_ratio": (sweep_cpu / n) / single_cpu,
        "projected_sweep_hours": steps_total * sweep_s / 3600,
        "projected_sequential_hours": n * steps_total * single_s / 3600,
        "load_before": load_before, "load_after": bench_train.load_average(),
    }
    row["sweep_peak_percent"] = 100 * row["sweep_gflops"] / peak
    row["single_peak_percent"] = 100 * bench_train.gflops(
        macs, members, fwd, args.batch, single_s) / peak
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def format_markdown(rows: list[dict[str, Any]], peak_label: str) -> str:
  lines = [
      f"% peak: of the float32 matmul peak ({peak_label})", "",
      "| model | N | sweep ms/step | aggregate img/s | one run img/s | "
      "speed-up | sweep step / N vs one run's: wall (CPU) | sweep compile s "
      "| N sequential compiles s | % peak (sweep / one) | projected h "
      "(sweep / sequential) | load |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['model']} | {r['runs']} | {r['sweep_ms']:.0f} "
        f"(min {r['sweep_min_ms']:.0f}) | {r['sweep_images_per_s']:.1f} | "
        f"{r['single_images_per_s']:.1f} | {r['speedup']:.2f}x | "
        f"{r['per_run_ratio']:.2f} ({r['per_run_cpu_ratio']:.2f}) | "
        f"{r['sweep_compile_s']:.1f} | "
        f"{r['sequential_compile_s']:.1f} | "
        f"{r['sweep_peak_percent']:.1f} / {r['single_peak_percent']:.1f} | "
        f"{r['projected_sweep_hours']:.2f} / "
        f"{r['projected_sequential_hours']:.2f} | "
        f"{r['load_before'][0]:.2f}/{r['load_after'][0]:.2f} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="resnet20",
                      help="comma-separated configs/default.py presets")
  parser.add_argument("--runs", type=argtypes.positive_int_list,
                      default="1,2,4",
                      help="comma-separated run counts N")
  parser.add_argument("--batch", type=argtypes.positive_int, default=128)
  parser.add_argument("--steps", type=argtypes.nonnegative_int, default=10,
                      help="PGD steps of the training attack")
  parser.add_argument("--repeats", type=argtypes.positive_int, default=5)
  parser.add_argument("--warmup", type=argtypes.nonnegative_int, default=1)
  parser.add_argument("--epochs", type=argtypes.positive_int, default=200,
                      help="epochs of the projected whole runs")
  parser.add_argument("--steps-per-epoch", type=argtypes.positive_int,
                      default=352,
                      help="steps an epoch of the projected whole runs "
                      "(45,000 images at batch 128: 352)")
  parser.add_argument("--device", default="auto",
                      choices=["auto", "cpu", "gpu"],
                      help="JAX's platform (auto: JAX's default)")
  parser.add_argument("--json", default=None, help="write the rows here")
  parser.add_argument("--md", default=None, help="write the table here")
  args = parser.parse_args(argv)
  if args.device != "auto":
    jax.config.update("jax_platforms", args.device)
  kernels.apply_xla_flags()  # before JAX starts its backend
  peak, peak_label, peak_meta = bench_train.measure_peak()
  meta = {"machine": platform.machine(), "cpu_count": os.cpu_count(),
          "jax": jax.__version__, "jax_backend": jax.default_backend(),
          "jax_device_kind": jax.devices()[0].device_kind,
          "xla_flags": os.environ.get("XLA_FLAGS", ""), **peak_meta,
          "args": vars(args)}
  print(json.dumps(meta), flush=True)
  runs = args.runs
  rows = []
  for model in args.models.split(","):
    rows += bench_model(model, runs, args, peak)
  table = format_markdown(rows, peak_label)
  print(table)
  bench_train.write_outputs(args, meta, rows, table)


if __name__ == "__main__":
  main()
