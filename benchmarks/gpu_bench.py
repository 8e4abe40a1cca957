"""fkjax's speed on one GPU: ``python -m benchmarks.gpu_bench``.

    python -m benchmarks.gpu_bench                  # a GPU, --max-seconds=330
    python -m benchmarks.gpu_bench --models resnet20 --precisions float32 \\
        --conv auto --sweep-sizes 8 --max-seconds 120
    python -m benchmarks.gpu_bench --smoke          # a CPU, tiny sizes

Measures, in order of importance, until ``--max-seconds`` are spent (what
would not fit is listed under ``skipped`` with the reason):

1. the card's roofs: bfloat16 and float32 matrix products (TFLOP/s) and
   its copy bandwidth (GB/s);
2. the PGD-10 training step of each ``--models`` (and its clean step, for
   ``python -m reproduce --dry-run --speed-from``): ms per step, images/s,
   compile seconds and TFLOP/s (XLA's count of the step's arithmetic);
3. two epochs of the paper's protocol through ``train.py
   --config=configs/default.py`` (En2ResNet20 on CIFAR-10 when the data are
   found, else synthetic CIFAR-shaped images, said in the JSON), then
   ``paper_run_minutes``: 200 x (epoch + validation);
4. a sweep of N runs as one program against one run (``--sweep-sizes``);
5. the steps in the other precisions;
6. the other ``train.py`` variants: the data pipeline (``host`` /
   ``device``, ``--train-variants``);
7. the steps with the other ``config.kernels.conv`` choices.

Writes ``--json`` (the environment: versions, device, date, commit; every
measurement, its units in its name: ``_ms``, ``_s``, ``_per_s``...) after
each measurement, and a readable ``--log``. On a GPU both default to
``benchmarks/results/gpu_latest.{json,log}``; elsewhere to the system's
temporary folder. ``--smoke`` runs all of it at tiny sizes (a ResNet8, a
few images, short roofs) on a CPU.
"""
from __future__ import annotations

# First, before the imports below (seconds): Ctrl-C during them is one line.
from fkjax import interrupt
if __name__ == "__main__":
  interrupt.install()
# pylint: disable=wrong-import-position

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

# The train.py subprocesses need the GPU's memory: this process takes it
# as it goes (a few GiB) instead of reserving 75% of it up front; they get
# the environment the user gave (USER_ENV), as train.py would.
USER_ENV = dict(os.environ)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from fkjax import cli
from fkjax import kernels
from fkjax import oserrors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_JSON = os.path.join("benchmarks", "results", "gpu_latest.json")

# (full size, --smoke) defaults of the flags left unset.
DEFAULTS = {
    "models": ("resnet20,en2resnet20", "resnet8"),
    "precisions": ("float32,tf32,bfloat16", "float32,bfloat16"),
    "conv": ("auto", "auto"),
    "sweep_sizes": ("8", "2"),
    "train_variants": ("auto,host", "auto,host"),
    "max_seconds": (330.0, 600.0),
    "batch_size": (128, 4),
    "attack_steps": (10, 2),
    "repeats": (20, 2),
    "warmup": (3, 1),
    "matmul_size": (8192, 256),
    "copy_mib": (1024, 16),
}
# A pessimistic guess of each measurement's seconds (full size, --smoke),
# to skip what would not fit in --max-seconds.
GUESS_S = {"roofs": (10, 3), "step": (20, 10), "train": (90, 40),
           "sweep": (30, 12)}
UNITS = {
    "_tflops": "10^12 floating-point operations per second",
    "_gb_per_s": "10^9 bytes per second",
    "_ms_median": "milliseconds",
    "_ms_min": "milliseconds",
    "_s": "seconds",
    "images_per_s": "images per second",
    "flops_per_step": "floating-point operations (XLA's cost analysis)",
    "_mib": "2^20 bytes",
    "paper_run_minutes": "minutes",
}


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m benchmarks.gpu_bench",
      description="fkjax's training speed on one GPU (docs/performance.md).")
  add = p.add_argument
  add("--models", help="comma-separated configs/default.py model presets "
      f"(default {DEFAULTS['models'][0]}; --smoke {DEFAULTS['models'][1]})")
  add("--precisions", help="config.precision values (default "
      f"{DEFAULTS['precisions'][0]})")
  add("--conv", help="config.kernels.conv values (default "
      f"{DEFAULTS['conv'][0]}; on GPUs auto is xla; onednn and "
      "explicit_grad are CPU-only)")
  add("--sweep-sizes", "--sweep_sizes", help="runs per sweep (default "
      f"{DEFAULTS['sweep_sizes'][0]}; '' for none)")
  add("--train-variants", "--train_variants",
      help="train.py variants: auto (the config's), host or device "
      "(config.training.data_pipeline); default "
      f"{DEFAULTS['train_variants'][0]}; '' for none")
  add("--max-seconds", "--max_seconds", type=float,
      help=f"time budget (default {DEFAULTS['max_seconds'][0]:.0f})")
  add("--batch-size", "--batch_size", type=int, help="images per step "
      f"(default {DEFAULTS['batch_size'][0]})")
  add("--attack-steps", "--attack_steps", type=int,
      help=f"PGD iterations of a step (default {DEFAULTS['attack_steps'][0]})")
  add("--repeats", type=int, help="timed steps per measurement (default "
      f"{DEFAULTS['repeats'][0]})")
  add("--warmup", type=int, help="untimed steps before them (default "
      f"{DEFAULTS['warmup'][0]})")
  add("--matmul-size", "--matmul_size", type=int,
      help=f"n of the n x n roof products (default {DEFAULTS['matmul_size'][0]})")
  add("--copy-mib", "--copy_mib", type=int,
      help=f"MiB of the bandwidth roof's array (default {DEFAULTS['copy_mib'][0]})")
  add("--data-dir", "--data_dir", default=None,
      help="config.dataset.data_dir for train.py (default: $FKJAX_DATA_DIR, "
      "else ~/.cache/fkjax/data)")
  add("--json", default=None, help=f"JSON output (on a GPU: {GPU_JSON})")
  add("--log", default=None, help="readable log (default: the JSON's path "
      "with .log)")
  add("--smoke", action="store_true",
      help="everything at tiny sizes, for a CPU (about a minute)")
  return p


def _names(text: str) -> list[str]:
  return [t.strip() for t in text.split(",") if t.strip()]


def settings(args: argparse.Namespace) -> dict[str, Any]:
  """The flags with their defaults filled in (full size or ``--smoke``)."""
  out = {}
  for key, pair in DEFAULTS.items():
    value = getattr(args, key)
    out[key] = pair[1 if args.smoke else 0] if value is None else value
  for key in ("models", "precisions", "conv", "train_variants"):
    out[key] = _names(out[key])
  out["sweep_sizes"] = [int(n) for n in _names(out["sweep_sizes"])]
  out["smoke"] = args.smoke
  return out


class Log:
  """Lines to stdout and to the log file, as they come."""

  def __init__(self, path: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self._file = open(path, "w")  # pylint: disable=consider-using-with

  def __call__(self, line: str = "") -> None:
    print(line, flush=True)
    self._file.write(line + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def _git(*argv: str) -> str | None:
  try:
    return subprocess.run(["git", *argv], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def _nvidia_driver() -> str | None:
  """The NVIDIA driver's version, where ``nvidia-smi`` answers."""
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                          "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  return out.strip().splitlines()[0] if out.strip() else None


def environment() -> dict[str, Any]:
  """What the figures were measured on and with."""
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  from fkjax import host  # pylint: disable=import-outside-toplevel
  versions = {}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy", "jax-cuda12-plugin",
               "jax-cuda13-plugin"):
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  devices = jax.devices()
  status = _git("status", "--porcelain", "--untracked-files=no")
  return {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
      "commit": _git("rev-parse", "HEAD"),
      "commit_has_local_changes": bool(status) if status is not None
                                  else None,
      "device_kind": devices[0].device_kind,
      "platform": devices[0].platform,
      "device_count": len(devices),
      "nvidia_driver": _nvidia_driver() if devices[0].platform == "gpu"
                       else None,
      "jax": jax.__version__, "jaxlib": jaxlib.__version__,
      "versions": versions,
      "python": platform.python_version(),
      "host_cpu": host.describe_cpu(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "command": " ".join(["python -m benchmarks.gpu_bench", *sys.argv[1:]]),
  }


class Budget:
  """Runs measurements while ``max_seconds`` last; records what it skips."""

  def __init__(self, max_seconds: float, smoke: bool, log: Log,
               skipped: dict[str, str]):
    self.deadline = time.monotonic() + max_seconds
    self.smoke, self.log, self.skipped = smoke, log, skipped

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def run(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or None when it would not fit or failed (said in the log
    and under ``skipped``: one failed measurement keeps the others)."""
    guess = GUESS_S[kind][1 if self.smoke else 0]
    if self.left() < guess:
      self.skipped[name] = (f"not run: {max(self.left(), 0):.0f} s of "
                            f"--max-seconds left, it needs ~{guess} s")
      self.log(f"{name}: skipped ({self.skipped[name]})")
      return None
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      self.skipped[name] = f"failed: {type(e).__name__}: {e}"[:500]
      self.log(f"{name}: {self.skipped[name]}")
      return None


def _step_line(r: dict[str, Any]) -> str:
  what = f"PGD-{r['attack_steps']}" if r["attack_steps"] else "clean"
  flops = (f", {r['tflops_per_s']:.2f} TFLOP/s"
           if r.get("tflops_per_s") is not None else "")
  return (f"{r['model']} {what} step, {r['precision']}, conv {r['conv']} "
          f"({r['conv_resolved']}), batch {r['batch_size']}: "
          f"{r['step_ms_median']:.2f} ms (min {r['step_ms_min']:.2f}), "
          f"{r['images_per_s']:.0f} images/s{flops}, compile "
          f"{r['compile_s']:.1f} s")


def _train_data(cfg: dict[str, Any], data_dir: str | None
                ) -> tuple[bool, str]:
  from benchmarks import gpu_bench_epochs as epochs  # pylint: disable=import-outside-toplevel
  found = epochs.find_cifar10(data_dir)
  if found:
    return True, f"CIFAR-10 ({found})"
  return False, ("synthetic CIFAR-shaped images (CIFAR-10 not found in "
                 f"{data_dir or 'the default data directory'}; "
                 "python -m fkjax.data.download cifar10 fetches it)")


def measure_all(cfg: dict[str, Any], args: argparse.Namespace,
                result: dict[str, Any], log: Log,
                save: Callable[[], None]) -> None:
  """Fills ``result`` measurement by measurement (``save`` after each),
  the workdirs in a temporary folder removed at the end."""
  scratch = tempfile.mkdtemp(prefix="fkjax_gpu_bench_")
  try:
    _measure_all(cfg, args, result, log, save, scratch)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _measure_roofs(cfg: dict[str, Any], budget: Budget,
                   result: dict[str, Any], log: Log,
                   save: Callable[[], None]) -> None:
  """The device's matmul and copy roofs, under ``result["roofs"]``."""
  from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
  roofs = budget.run("roofs", "roofs", lambda: steps.roofs(
      cfg["matmul_size"], cfg["copy_mib"], calls=10 if not cfg["smoke"]
      else 3))
  if roofs:
    result["roofs"] = roofs
    log(f"roofs: bf16 matmul {roofs['matmul_bf16_tflops']:.2f} TFLOP/s, "
        f"float32 {roofs['matmul_float32_tflops']:.2f} (default precision), "
        f"{roofs['matmul_float32_highest_tflops']:.2f} (highest); copy "
        f"{roofs['copy_gb_per_s']:.0f} GB/s")
    save()


def _measure_sweeps(cfg: dict[str, Any], budget: Budget,
                    result: dict[str, Any], log: Log,
                    save: Callable[[], None], precision: str,
                    conv: str) -> None:
  """The PGD step of sweeps of ``cfg["sweep_sizes"]`` runs of the first
  model, each against one run's step when that was measured, under
  ``result["sweeps"]``."""
  from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  model = cfg["models"][0]
  single = next((r for r in result["steps"] if r["model"] == model
                 and r["attack_steps"]), None)
  for runs in cfg["sweep_sizes"]:
    spec = steps.StepSpec(model, precision, conv, cfg["attack_steps"],
                          cfg["batch_size"])
    r = budget.run(f"sweep {runs} x {model}", "sweep",
                   lambda spec=spec, runs=runs: steps.measure_sweep(
                       spec, runs, cfg["repeats"], cfg["warmup"]))
    jax.clear_caches()
    if r:
      if single:
        r["single_run_step_ms_median"] = single["step_ms_median"]
        r["speedup"] = runs * single["step_ms_median"] / r["step_ms_median"]
      result["sweeps"].append(r)
      log(f"sweep of {runs} {model}: {r['step_ms_median']:.2f} ms a step, "
          f"{r['images_per_s']:.0f} images/s"
          + (f", {r['speedup']:.2f}x one run" if "speedup" in r else ""))
      save()


def _measure_all(cfg: dict[str, Any], args: argparse.Namespace,
                 result: dict[str, Any], log: Log, save: Callable[[], None],
                 scratch: str) -> None:
  from benchmarks import gpu_bench_epochs as epochs  # pylint: disable=import-outside-toplevel
  from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  budget = Budget(cfg["max_seconds"], cfg["smoke"], log, result["skipped"])
  _measure_roofs(cfg, budget, result, log, save)

  def step(model: str, precision: str, conv: str, attack_steps: int):
    spec = steps.StepSpec(model, precision, conv, attack_steps,
                          cfg["batch_size"])
    name = f"step {model} {precision} {conv} k={attack_steps}"
    r = budget.run(name, "step", lambda: steps.measure_step(
        spec, cfg["repeats"], cfg["warmup"]))
    jax.clear_caches()
    if r:
      result["steps"].append(r)
      log(_step_line(r))
      save()
    return r

  first_p, first_c = cfg["precisions"][0], cfg["conv"][0]
  for model in cfg["models"]:
    step(model, first_p, first_c, cfg["attack_steps"])
    step(model, first_p, first_c, 0)

  real, data = _train_data(cfg, args.data_dir)
  result["train_data"] = data
  common = epochs.data_overrides(real, cfg["smoke"], args.data_dir)
  if cfg["smoke"]:
    # no compiled programs left in the user's cache by a smoke run
    common["compilation_cache_dir"] = os.path.join(scratch, "jax_cache")

  def train(variant: str) -> None:
    workdir = os.path.join(scratch, f"train_{len(result['epochs'])}")
    r = budget.run(f"train.py {variant}", "train", lambda: epochs.run_variant(
        variant, workdir, common, cfg["smoke"],
        timeout_s=max(budget.left(), 60) + 60, env=USER_ENV))
    if r:
      result["epochs"].append(r)
      log(f"train.py {variant} ({r['command']}): epoch 2 {r['epoch_s']:.2f} s "
          f"({r['train_images_per_s']:.0f} images/s), validation "
          f"{r['val_s']:.2f} s; epoch 1 {r['epoch1_s']:.1f} s")
      if variant == "auto":
        result["paper_run_minutes"] = epochs.paper_run_minutes(r)
        log(f"paper_run_minutes: {result['paper_run_minutes']:.1f} (200 x "
            "(epoch + validation) of train.py auto)")
      save()

  variants = cfg["train_variants"]
  if variants:
    train(variants[0])

  _measure_sweeps(cfg, budget, result, log, save, first_p, first_c)

  for precision in cfg["precisions"][1:]:
    for model in cfg["models"]:
      step(model, precision, first_c, cfg["attack_steps"])
  for variant in variants[1:]:
    train(variant)
  for conv in cfg["conv"][1:]:
    for precision in cfg["precisions"]:
      for model in cfg["models"]:
        step(model, precision, conv, cfg["attack_steps"])


def summary_table(result: dict[str, Any]) -> str:
  """The figures in a few lines, for the end of the log."""
  lines = ["", "summary"]
  for r in result["steps"]:
    lines.append("  " + _step_line(r))
  for r in result["sweeps"]:
    lines.append(f"  sweep of {r['runs']} {r['model']}: "
                 + (f"{r['speedup']:.2f}x one run" if "speedup" in r
                    else f"{r['images_per_s']:.0f} images/s"))
  for r in result["epochs"]:
    lines.append(f"  train.py {r['variant']}: epoch {r['epoch_s']:.2f} s, "
                 f"validation {r['val_s']:.2f} s")
  if result.get("paper_run_minutes") is not None:
    lines.append(f"  paper_run_minutes: {result['paper_run_minutes']:.1f}")
  for name, why in result["skipped"].items():
    lines.append(f"  {name}: {why}")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  cfg = settings(args)
  kernels.apply_xla_flags()   # as train.py does, before JAX's backend starts
  import jax  # pylint: disable=import-outside-toplevel
  from absl import logging  # pylint: disable=import-outside-toplevel
  from benchmarks import gpu_bench_epochs as epochs  # pylint: disable=import-outside-toplevel
  from fkjax import atomic  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  for variant in cfg["train_variants"]:
    try:
      epochs.parse_variant(variant)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  on_gpu = jax.devices()[0].platform == "gpu"
  json_path = args.json or (os.path.join(REPO, GPU_JSON) if on_gpu else
                            os.path.join(tempfile.gettempdir(),
                                         "fkjax_gpu_bench", "latest.json"))
  log_path = args.log or os.path.splitext(json_path)[0] + ".log"
  # Before anything is measured: the folders the results are written to.
  for flag, path in (("--json", json_path), ("--log", log_path)):
    oserrors.declare(flag, path, write=True, file=True)
  log = Log(log_path)
  result: dict[str, Any] = {
      "benchmark": "python -m benchmarks.gpu_bench",
      "environment": environment(), "settings": cfg, "units": UNITS,
      "roofs": None, "steps": [], "sweeps": [], "epochs": [],
      "train_data": None, "paper_run_minutes": None, "skipped": {}}
  env = result["environment"]
  log(f"fkjax gpu_bench {env['date']}, commit {env['commit']}: "
      f"{env['device_count']} x {env['device_kind']} ({env['platform']}), "
      f"jax {env['jax']}, jaxlib {env['jaxlib']}"
      + (" (--smoke: tiny sizes)" if cfg["smoke"] else ""))

  def save() -> None:
    atomic.write_json(json_path, result)

  try:
    measure_all(cfg, args, result, log, save)
  finally:
    save()
    log(summary_table(result))
    log(f"\nwrote {json_path} and {log_path}")
    log.close()
  measured = result["steps"] or result["epochs"]
  return 0 if measured else 1


INTERRUPTED = ("interrupted; what was measured so far is in the --json "
               "written after each measurement")


def _run_cli() -> int:
  """``main`` for the shell: a wrong environment variable, a folder that
  cannot be written, Ctrl-C at any moment: one line."""
  try:
    cli.check_environment()
    return cli.guard(main, interrupted=INTERRUPTED)
  except SystemExit as e:
    return cli.exit_code(e)


if __name__ == "__main__":
  cli.exit(_run_cli())
