"""fkjax vs PyTorch eager: train steps and IFGSM^20 evaluation, same run.

Usage (from the repository root; torch from benchmarks/requirements-bench.txt):

  python -m benchmarks.bench_train --batch 32 --models resnet20 --repeats 3
  python -m benchmarks.bench_train --batch 128 --eval-batch 500 \
      --models resnet20,en2resnet20 --benches clean,pgd,pgd_bneval,ifgsm \
      --json bench.json --md bench.md
  python -m benchmarks.bench_train --device cuda --repeats 20 --warmup 3  # GPU

Benches (each for every model):
  clean       natural training step (forward + backward + SGD)
  pgd         PGD-``--steps`` adversarial training step, BatchNorm in "train"
              mode during the attack (the authors' choice, fkjax's default)
  pgd_bneval  the same with config.attack.bn_mode="eval"
  ifgsm       IFGSM^``--eval-steps`` evaluation of one ``--eval-batch`` batch
              plus the prediction (fkjax.evaluation.loop.Evaluator)

The fkjax side is ``fkjax.training.step_lib.make_train_step`` jitted exactly as
``train_and_evaluate`` jits it (state donated) with ``configs/default.py``
presets; the PyTorch side is ``benchmarks/torch_reference.py``. Timings are
medians (and minima, the robust figure on a shared machine) over
``--repeats`` runs after ``--warmup`` runs, fkjax and PyTorch alternating so
that outside load hits both alike; compile time is reported apart.
images/s is the batch over the median time. GFLOP/s counts ``2 * MACs`` of
the convolutions and the head (see ``forward_macs``) times the
forward-equivalents of the bench (see ``forward_equivalents``), against the
float32 matmul peak measured at the start of the run.

Devices: fkjax runs on JAX's default backend; PyTorch on ``--device``
(``auto``: ``cuda`` if ``torch.cuda.is_available()``, else ``cpu``). Both
sides keep one fixed batch on the host and copy it to their device inside
every timed step (``jax.device_put``, ``Tensor.to``), so both pay the
host->device copy, as in training; the models stay on the device. On
``cuda``, ``torch.backends.cudnn.benchmark`` is on (PyTorch autotunes and
gets its best convolution algorithms; the warm-up runs absorb the tuning)
and every timed PyTorch step ends with ``torch.cuda.synchronize()``. On a
JAX GPU backend the peak is a jitted 8192^2 float32 ``jnp.dot`` instead of
numpy's: measured with JAX's default precision (TF32 on Ampere/Hopper,
the peak of the % columns) and with ``Precision.HIGHEST`` (true float32),
both recorded in the meta line.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from configs import default as default_config
from fkjax import argtypes
from fkjax.evaluation import loop as eval_loop
from fkjax.training import validation
from fkjax.training import build
from fkjax import kernels
from fkjax.training import step as step_lib

BENCHES = ("clean", "pgd", "pgd_bneval", "ifgsm")


# --------------------------------------------------------------------------
# Work counts.


def forward_macs(depth: int = 20, num_classes: int = 10, width: int = 1,
                 image_size: int = 32) -> int:
  """Multiply-adds of one PreActResNet forward pass on one image.

  Convolutions and the dense head; BatchNorm, ReLU and the noise are
  elementwise and left out (they are memory-bound, not FLOP-bound).
  """
  n = (depth - 2) // 6
  size = image_size
  macs = size * size * 3 * 16 * width * 9  # stem
  cin = 16 * width
  for stage, features in enumerate((16, 32, 64)):
    cout = features * width
    for block in range(n):
      stride = 2 if stage > 0 and block == 0 else 1
      size_out = size // stride
      macs += size_out * size_out * cin * cout * 9     # conv1
      macs += size_out * size_out * cout * cout * 9    # conv2
      if stride != 1 or cin != cout:
        macs += size_out * size_out * cin * cout       # 1x1 shortcut
      size, cin = size_out, cout
  return macs + cin * num_classes


def forward_equivalents(bench: str, attack_steps: int, eval_steps: int,
                        track_clean: bool = True) -> float:
  """Cost of a bench in forward passes, counting a backward pass as:

  2 forwards when the weight gradients are needed (input + weight gradient),
  1 forward when only the input gradient is (the attack's steps).
  """
  if bench == "clean":
    return 3.0
  if bench in ("pgd", "pgd_bneval"):
    return 2.0 * attack_steps + 3.0 + (1.0 if track_clean else 0.0)
  if bench == "ifgsm":
    return 2.0 * eval_steps + 1.0
  raise ValueError(f"unknown bench {bench!r}")


def gflops(macs_per_image: int, members: int, fwd_equiv: float, batch: int,
           seconds: float) -> float:
  """Achieved GFLOP/s (1 MAC = 2 FLOP)."""
  return 2.0 * macs_per_image * members * fwd_equiv * batch / seconds / 1e9


def matmul_peak_gflops(n: int = 4096, repeats: int = 3) -> float:
  """float32 ``n x n`` matmul GFLOP/s of numpy (BLAS), best of ``repeats``."""
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, n), dtype=np.float32)
  b = rng.standard_normal((n, n), dtype=np.float32)
  a @ b  # warm-up
  best = min(_seconds(lambda: a @ b) for _ in range(repeats))
  return 2.0 * n**3 / best / 1e9


def jax_matmul_tflops(n: int = 8192, repeats: int = 10,
                      precision=None) -> float:
  """TFLOP/s of a jitted float32 ``n x n`` ``jnp.dot`` on JAX's default device.

  ``precision=None`` is JAX's default (TF32 on Ampere/Hopper GPUs),
  ``jax.lax.Precision.HIGHEST`` true float32. Median of ``repeats`` calls
  after two warm-up calls (the first compiles).
  """
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), jnp.float32)
  b = jax.random.normal(kb, (n, n), jnp.float32)
  dot = jax.jit(functools.partial(jnp.dot, precision=precision))
  for _ in range(2):
    dot(a, b).block_until_ready()
  seconds = [_seconds(lambda: dot(a, b).block_until_ready())
             for _ in range(repeats)]
  return 2.0 * n**3 / statistics.median(seconds) / 1e12


def measure_peak(n: int = 4096) -> tuple[float, str, dict[str, Any]]:
  """(GFLOP/s, description, meta fields) of the peak of the % columns.

  numpy's float32 matmul on a CPU backend. On a JAX GPU backend, ``jnp.dot``
  at JAX's default precision (TF32), the precision fkjax's convolutions run
  at by default; ``Precision.HIGHEST`` (true float32) is recorded beside it.
  """
  if jax.default_backend() != "gpu":
    peak = matmul_peak_gflops(n)
    label = f"numpy {n}^2"
    return peak, label, {"matmul_peak_gflops": peak, "peak": label}
  n = 2 * n
  default = jax_matmul_tflops(n)
  highest = jax_matmul_tflops(n, precision=jax.lax.Precision.HIGHEST)
  label = (f"jnp.dot {n}^2 at JAX's default precision = TF32; "
           f"Precision.HIGHEST (true float32): {highest:.1f} TFLOP/s")
  return 1e3 * default, label, {"matmul_peak_gflops": 1e3 * default,
                                "gpu_matmul_tflops_default": default,
                                "gpu_matmul_tflops_highest": highest,
                                "peak": label}


# --------------------------------------------------------------------------
# Timing.


def _seconds(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def load_average() -> tuple[float, float, float]:
  """The 1, 5 and 15 minute load averages (``uptime``); NaNs if unknown."""
  try:
    return tuple(round(x, 2) for x in os.getloadavg())
  except OSError:
    return (float("nan"),) * 3


def interleaved(runners: dict[str, Callable[[], Any]], repeats: int,
                warmup: int = 1) -> dict[str, list[float]]:
  """Seconds of each runner, ``repeats`` times, alternating between runners.

  Each runner must block until its work is done. ``warmup`` untimed calls of
  each come first.
  """
  for run in runners.values():
    for _ in range(warmup):
      run()
  times: dict[str, list[float]] = {name: [] for name in runners}
  for _ in range(repeats):
    for name, run in runners.items():
      times[name].append(_seconds(run))
  return times


# --------------------------------------------------------------------------
# fkjax side.


def fkjax_config(model: str, bench: str, batch: int, attack_steps: int,
                 eval_steps: int, unroll: str | None):
  config = default_config.get_config(model)
  config.training.batch_size = batch
  config.training.adversarial = bench != "clean"
  config.attack.num_steps = attack_steps
  config.attack.bn_mode = "eval" if bench == "pgd_bneval" else "train"
  config.validation.attack_steps = eval_steps
  if unroll is not None:
    config.attack.unroll = attack_steps if unroll == "true" else int(unroll)
  return config


def random_batch(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A CIFAR-shaped batch of uniform images and labels (speed does not
  depend on pixel values)."""
  rng = np.random.default_rng(seed)
  return {"image": rng.random((batch, 32, 32, 3), dtype=np.float32),
          "label": rng.integers(0, 10, batch).astype(np.int32)}


def _memory_mb(compiled) -> float | None:
  try:
    m = compiled.memory_analysis()
    total = (m.temp_size_in_bytes + m.argument_size_in_bytes
             + m.output_size_in_bytes - m.alias_size_in_bytes)
    return round(total / 2**20, 1)
  except Exception:  # pylint: disable=broad-except
    return None  # not every backend reports it


def fkjax_runner(config, bench: str, batch: int) -> tuple[Callable, dict]:
  """(run, info): ``run()`` does one blocking step; info has compile time."""
  model = build.create_model(config, 10)
  optimizer = build.create_optimizer(config, steps_per_epoch=391)
  state = build.init_state(model, optimizer, jax.random.key(0))
  num_params = sum(x.size for x in jax.tree.leaves(state["params"]))
  host = random_batch(batch)
  key = jax.random.key(1)
  if bench == "ifgsm":
    eval_apply, _ = build.model_fns(model)
    attack = validation.attacks(config)
    attack = {name: fn for name, fn in attack.items() if name != "natural"}
    evaluator = eval_loop.Evaluator(eval_apply, attack)
    variables = {"params": state["params"],
                 "batch_stats": state["batch_stats"]}
    run = lambda: evaluator(variables, [host], key)
    first = run()
    name = next(iter(attack))
    compile_s = (first.attacks[name].compile_seconds
                 + first.predict_compile_seconds)
    memory = _memory_mb(evaluator.compiled_attacks(name)[0])
    return run, {"compile_s": compile_s, "num_params": num_params,
                 "memory_mb": memory}

  step = jax.jit(step_lib.make_train_step(model, optimizer, config),
                 donate_argnums=(0,))
  start = time.perf_counter()
  compiled = step.lower(state, jax.device_put(host), key).compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state}

  def run():
    # The host batch is put on the device every step, as in training.
    new_state, metrics = compiled(holder["state"], jax.device_put(host), key)
    jax.block_until_ready(metrics)
    holder["state"] = new_state
  return run, {"compile_s": compile_s, "num_params": num_params,
               "memory_mb": _memory_mb(compiled)}


# --------------------------------------------------------------------------
# PyTorch side.


def resolve_device(name: str) -> str:
  """``--device``: "auto" is "cuda" when torch sees a GPU, else "cpu"."""
  import torch  # pylint: disable=import-outside-toplevel
  if name == "auto":
    return "cuda" if torch.cuda.is_available() else "cpu"
  if name not in ("cpu", "cuda"):
    raise ValueError(f"unknown device {name!r}")
  if name == "cuda" and not torch.cuda.is_available():
    raise ValueError("--device cuda, but torch.cuda.is_available() is False")
  return name


def jax_device_label() -> str:
  """JAX's backend and, when it says more, its first device's kind."""
  backend, kind = jax.default_backend(), jax.devices()[0].device_kind
  return backend if kind == backend else f"{backend} ({kind})"


def torch_runner(config, bench: str, batch: int,
                 device: str = "cpu") -> tuple[Callable, dict]:
  """(run, info) of the PyTorch side, the model on ``device``."""
  import torch  # pylint: disable=import-outside-toplevel
  from benchmarks import torch_reference as ref  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  model = ref.create_model_from_config(config.model, device=device)
  optimizer = ref.make_optimizer(model)
  host = random_batch(batch)
  images = torch.from_numpy(host["image"].transpose(0, 3, 1, 2).copy())
  labels = torch.from_numpy(host["label"].astype(np.int64))
  info = {"compile_s": 0.0, "num_params": ref.num_params(model),
          "memory_mb": None}
  if bench == "ifgsm":
    step = lambda x, y: ref.eval_ifgsm(model, x, y,
                                       config.validation.attack_steps)
  else:
    step = lambda x, y: ref.train_step(
        model, optimizer, x, y, adversarial=config.training.adversarial,
        num_steps=config.attack.num_steps, bn_mode=config.attack.bn_mode,
        track_clean=config.training.track_clean_accuracy)

  def run():
    # The host batch goes to the device every step, as on the fkjax side
    # (a no-op on the CPU).
    out = step(images.to(device, non_blocking=False),
               labels.to(device, non_blocking=False))
    if device == "cuda":
      # float()/int() of the metrics already wait for the GPU; be explicit.
      torch.cuda.synchronize()
    return out
  return run, info


# --------------------------------------------------------------------------
# Report.


def _ms(row: dict[str, Any], name: str) -> str:
  if row.get(f"{name}_ms") is None:
    return "-"
  return f"{row[f'{name}_ms']:.0f} ({row[f'{name}_min_ms']:.0f})"


def format_markdown(rows: list[dict[str, Any]], peak: float,
                    peak_label: str = "numpy 4096^2",
                    devices: dict[str, str] | None = None) -> str:
  """A Markdown table of the result rows (one per model and bench).

  ``peak`` (GFLOP/s, described by ``peak_label``) is the base of the % peak
  columns; ``devices`` maps framework to the device it ran on, for the line
  above the table.
  """
  lines = [f"float32 matmul peak ({peak_label}, this run): {peak:.1f} GFLOP/s",
           ""]
  if devices:
    lines += [", ".join(f"{name} on {where}"
                        for name, where in devices.items()), ""]
  lines += [
      "| model | bench | batch | fkjax ms (min) | torch ms (min) | "
      "fkjax/torch (of mins) | fkjax images/s | torch images/s | "
      "fkjax GFLOP/s (% peak) | torch GFLOP/s (% peak) | fkjax compile s | "
      "fkjax mem MB | load 1m before/after |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  fmt = lambda x, f: "-" if x is None else format(x, f)
  for r in rows:
    both = r.get("fkjax_ms") and r.get("torch_ms")
    ratio = r["fkjax_ms"] / r["torch_ms"] if both else None
    ratio_min = r["fkjax_min_ms"] / r["torch_min_ms"] if both else None
    cells = [
        r["model"], r["bench"], str(r["batch"]),
        _ms(r, "fkjax"), _ms(r, "torch"),
        f"{fmt(ratio, '.2f')} ({fmt(ratio_min, '.2f')})",
        fmt(r.get("fkjax_images_per_s"), ".1f"),
        fmt(r.get("torch_images_per_s"), ".1f"),
        (f"{r['fkjax_gflops']:.1f} ({100 * r['fkjax_gflops'] / peak:.0f}%)"
         if r.get("fkjax_gflops") else "-"),
        (f"{r['torch_gflops']:.1f} ({100 * r['torch_gflops'] / peak:.0f}%)"
         if r.get("torch_gflops") else "-"),
        fmt(r.get("fkjax_compile_s"), ".1f"),
        fmt(r.get("fkjax_memory_mb"), ".0f"),
        f"{r['load_before'][0]:.2f}/{r['load_after'][0]:.2f}",
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def timing_fields(name: str, seconds: list[float], batch: int,
                  macs_per_image: int, members: int,
                  fwd_equiv: float) -> dict[str, Any]:
  """Row fields of one framework's timed runs (``seconds``, not empty)."""
  median = statistics.median(seconds)
  return {f"{name}_ms": 1e3 * median,
          f"{name}_min_ms": 1e3 * min(seconds),
          f"{name}_times_ms": [round(1e3 * t, 1) for t in seconds],
          f"{name}_images_per_s": batch / median,
          f"{name}_gflops": gflops(macs_per_image, members, fwd_equiv, batch,
                                   median)}


def run_bench(model: str, bench: str, args) -> dict[str, Any]:
  """One row: ``bench`` of ``model`` timed on the frameworks of ``args``."""
  batch = args.eval_batch if bench == "ifgsm" else args.batch
  config = fkjax_config(model, bench, batch, args.steps, args.eval_steps,
                        args.unroll)
  config.kernels.conv = args.conv
  config.kernels.noise = args.noise
  config.kernels.member_execution = args.member_execution
  resolved = build.resolve_kernels(config).names
  row: dict[str, Any] = {"model": model, "bench": bench, "batch": batch,
                         "load_before": load_average(),
                         "unroll": str(config.attack.unroll), **resolved}
  runners, infos = {}, {}
  if "fkjax" in args.frameworks:
    runners["fkjax"], infos["fkjax"] = fkjax_runner(config, bench, batch)
  if "torch" in args.frameworks:
    runners["torch"], infos["torch"] = torch_runner(config, bench, batch,
                                                    args.torch_device)
  times = interleaved(runners, args.repeats, args.warmup)
  row["load_after"] = load_average()
  members = config.model.ensemble_size
  macs = forward_macs(config.model.depth)
  fwd = forward_equivalents(bench, args.steps, args.eval_steps,
                            config.training.track_clean_accuracy)
  row["forward_equivalents"] = fwd
  for name, ts in times.items():
    row[f"{name}_compile_s"] = infos[name]["compile_s"]
    if ts:  # --repeats 0 measures compile time and memory only
      row.update(timing_fields(name, ts, batch, macs, members, fwd))
    row[f"{name}_memory_mb"] = infos[name]["memory_mb"]
    row[f"{name}_num_params"] = infos[name]["num_params"]
  if "fkjax_ms" in row and "torch_ms" in row:
    row["ratio_fkjax_over_torch"] = row["fkjax_ms"] / row["torch_ms"]
  return row


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="resnet20,en2resnet20",
                      help="comma-separated configs/default.py presets")
  parser.add_argument("--benches", default=",".join(BENCHES))
  parser.add_argument("--frameworks", default="fkjax,torch")
  parser.add_argument("--batch", type=argtypes.positive_int, default=128)
  parser.add_argument("--eval-batch", type=argtypes.positive_int, default=500)
  parser.add_argument("--steps", type=argtypes.nonnegative_int, default=10,
                      help="PGD steps of the training attack")
  parser.add_argument("--eval-steps", type=argtypes.positive_int, default=20,
                      help="IFGSM steps of the evaluation")
  parser.add_argument("--repeats", type=argtypes.nonnegative_int, default=5,
                      help="timed runs; 0 measures compile time only")
  parser.add_argument("--warmup", type=argtypes.nonnegative_int, default=1)
  parser.add_argument("--unroll", default=None,
                      help="override config.attack.unroll: 'true' (the whole "
                      "loop written out) or an int (lax.scan unroll)")
  parser.add_argument("--device", default="auto",
                      choices=["auto", "cpu", "cuda"],
                      help="PyTorch's device; auto: cuda if available")
  parser.add_argument("--conv", default="auto",
                      choices=["auto", "explicit_grad", "onednn", "xla"],
                      help="config.kernels.conv (fkjax/kernels)")
  parser.add_argument("--noise", "--noise-impl", default="auto",
                      choices=["auto", "model", "jnp", "fused"],
                      help="config.kernels.noise (fkjax/kernels)")
  parser.add_argument("--member-execution", default="auto",
                      choices=["auto", "batched", "sequential", "unrolled"],
                      help="config.kernels.member_execution (ensembles)")
  parser.add_argument("--peak-size", type=argtypes.positive_int,
                      default=4096, help="matrix size of the matmul peak "
                      "(numpy's; twice it for jnp.dot on a GPU)")
  parser.add_argument("--json", default=None, help="write the rows here")
  parser.add_argument("--md", default=None, help="write the table here")
  return parser


def _devices(args: argparse.Namespace) -> dict[str, str]:
  """The device of each framework in ``args.frameworks``; sets PyTorch's
  threads, its device (``args.torch_device``) and cuDNN autotuning."""
  args.torch_device = None
  devices = {}
  if "fkjax" in args.frameworks:
    devices["fkjax"] = jax_device_label()
  if "torch" in args.frameworks:
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(os.cpu_count() or 1)
    args.torch_device = resolve_device(args.device)
    devices["torch"] = args.torch_device
    if args.torch_device == "cuda":
      # Autotuning: PyTorch gets its best convolution algorithms for each
      # shape (the warm-up runs pay for the tuning).
      torch.backends.cudnn.benchmark = True
      devices["torch"] = f"cuda ({torch.cuda.get_device_name()})"
  return devices


def _environment(args: argparse.Namespace, devices: dict[str, str],
                 peak_meta: dict[str, Any]) -> dict[str, Any]:
  """The JSON ``meta``: machine, versions, XLA flags, precision settings,
  the matmul peak, devices and arguments."""
  meta = {"machine": platform.machine(), "processor": platform.processor(),
          "cpu_count": os.cpu_count(), "jax": jax.__version__,
          "jax_backend": jax.default_backend(),
          "jax_device_kind": jax.devices()[0].device_kind,
          "jax_default_matmul_precision":
              jax.config.jax_default_matmul_precision,
          "xla_flags": os.environ.get("XLA_FLAGS", ""),
          **peak_meta, "devices": devices, "args": vars(args)}
  if "torch" in args.frameworks:
    import torch  # pylint: disable=import-outside-toplevel
    meta["torch"] = torch.__version__
    meta["torch_threads"] = torch.get_num_threads()
    meta["torch_device"] = args.torch_device
    # TF32 use of PyTorch's convolutions (cuDNN) and matmuls, on cuda.
    meta["torch_cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
    meta["torch_cuda_matmul_allow_tf32"] = (
        torch.backends.cuda.matmul.allow_tf32)
    if args.torch_device == "cuda":
      meta["torch_cuda_device_name"] = torch.cuda.get_device_name()
      meta["torch_cudnn_benchmark"] = torch.backends.cudnn.benchmark
  return meta


def main(argv: list[str] | None = None) -> None:
  args = _parser().parse_args(argv)
  kernels.apply_xla_flags()  # before JAX starts its backend
  args.frameworks = args.frameworks.split(",")
  devices = _devices(args)
  peak, peak_label, peak_meta = measure_peak(args.peak_size)
  meta = _environment(args, devices, peak_meta)
  print(json.dumps(meta), flush=True)
  rows = []
  for model in args.models.split(","):
    for bench in args.benches.split(","):
      row = run_bench(model, bench, args)
      rows.append(row)
      print(json.dumps(row), flush=True)
  table = format_markdown(rows, peak, peak_label, devices)
  print(table)
  write_outputs(args, meta, rows, table)


def write_outputs(args: argparse.Namespace, meta: dict, rows: list,
                  table: str) -> None:
  """Writes ``--json`` (meta and rows) and ``--md`` (the table) if given."""
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"meta": meta, "rows": rows}, f, indent=2)
  if args.md:
    with open(args.md, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  main()
