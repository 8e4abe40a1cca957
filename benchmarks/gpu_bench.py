"""fkjax's speed on one GPU: ``python -m benchmarks.gpu_bench``.

    python -m benchmarks.gpu_bench                  # a GPU, --max-seconds=330
    python -m benchmarks.gpu_bench --models resnet20 --precisions float32 \\
        --conv auto --sweep-sizes 8 --max-seconds 120
    python -m benchmarks.gpu_bench --smoke          # a CPU, tiny sizes

Measures, the rows that set a default first (``gpu_bench_plan.plan``),
until ``--max-seconds`` are spent; a row starts only where its estimate
(from the compile and step times of the rows already run) fits, and what
would not is listed under ``skipped`` with the reason:

1. the PGD-10 training step of each ``--models`` in each ``--precisions``
   (float32, tf32, bfloat16): ms per step, images/s, compile seconds and
   TFLOP/s (XLA's count of the step's arithmetic);
2. two epochs of the paper's protocol through ``train.py
   --config=configs/default.py`` on one device (En2ResNet20 on CIFAR-10
   when the data are found, else synthetic CIFAR-shaped images, said in
   the JSON), then ``paper_run_minutes``: 200 x an epoch's wall time;
3. a sweep of N runs as one program against one run (``--sweep-sizes``);
4. the card's roofs: bfloat16 and float32 matrix products (TFLOP/s) and
   its copy bandwidth (GB/s);
5. the clean steps (for ``python -m reproduce --dry-run --speed-from``);
6. the variants: the step under other XLA flags (``--xla-variants``: conv
   layout, autotune level, deterministic ops), the other ``train.py`` data
   pipelines (``--train-variants``), the other ``config.kernels.conv``.

Writes ``--json`` (the environment: versions, device, date, commit; every
measurement, its units in its name: ``_ms``, ``_s``, ``_per_s``...) after
each row (atomically: a stopped run, by Ctrl-C, SIGTERM or the budget,
leaves every row measured so far and ``stopped`` saying why), and a
readable ``--log``. On a GPU both default to
``benchmarks/results/gpu_latest.{json,log}``; elsewhere to the system's
temporary folder. ``--smoke`` runs every kind of row at tiny sizes (a
ResNet8, a few images, short roofs) on a CPU, compiled with
``--xla_backend_optimization_level=0`` (its times mean nothing).
"""
from __future__ import annotations

# First, before the imports below (seconds): Ctrl-C, or a missing package of
# the [train] extra, during them is one line (fkjax.entry).
from fkjax import entry
if __name__ == "__main__":
  entry.start()
# pylint: disable=wrong-import-position

import argparse
import dataclasses
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable

# The train.py subprocesses need the GPU's memory: this process takes it
# as it goes (a few GiB) instead of reserving 75% of it up front; they get
# the environment the user gave (USER_ENV), as train.py would.
USER_ENV = dict(os.environ)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks import gpu_bench_plan as plan_lib
from benchmarks.gpu_bench_plan import XLA_VARIANTS
from fkjax import cli
from fkjax import kernels
from fkjax import oserrors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_JSON = os.path.join("benchmarks", "results", "gpu_latest.json")

# (full size, --smoke) defaults of the flags left unset.
DEFAULTS = {
    "models": ("resnet20,en2resnet20", "resnet8"),
    "precisions": ("float32,tf32,bfloat16", "float32,tf32"),
    "conv": ("auto", "auto"),
    "sweep_sizes": ("8", "2"),
    "sweep_precision": ("tf32", "float32"),
    "train_variants": ("auto,host", "auto"),
    "xla_variants": (",".join(XLA_VARIANTS), "deterministic"),
    "max_seconds": (330.0, 600.0),
    "batch_size": (128, 4),
    "attack_steps": (10, 2),
    "repeats": (20, 2),
    "warmup": (3, 1),
    "matmul_size": (8192, 256),
    "copy_mib": (1024, 16),
}
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
  add("--sweep-precision", "--sweep_precision", help="config.precision of "
      "the sweep and the XLA variants (default "
      f"{DEFAULTS['sweep_precision'][0]})")
  add("--xla-variants", "--xla_variants", help="the step under XLA flags: "
      + ", ".join(f"{k} ({v})" for k, v in XLA_VARIANTS.items())
      + f"; default {DEFAULTS['xla_variants'][0]}; '' for none")
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
      help="every kind of row at tiny sizes, for a CPU (under a minute of "
      "CPU time)")
  return p


def _names(text: str) -> list[str]:
  return [t.strip() for t in text.split(",") if t.strip()]


def settings(args: argparse.Namespace) -> dict[str, Any]:
  """The flags with their defaults filled in (full size or ``--smoke``)."""
  out = {}
  for key, pair in DEFAULTS.items():
    value = getattr(args, key)
    out[key] = pair[1 if args.smoke else 0] if value is None else value
  for key in ("models", "precisions", "conv", "train_variants",
              "xla_variants"):
    out[key] = _names(out[key])
  out["sweep_sizes"] = [int(n) for n in _names(out["sweep_sizes"])]
  out["smoke"] = args.smoke
  return out


def check_settings(cfg: dict[str, Any]) -> str | None:
  """None, or the line that refuses a value of a flag, naming it: every
  row's config is built and checked against fkjax's schema before any
  row runs."""
  # pylint: disable=import-outside-toplevel
  from benchmarks import gpu_bench_epochs as epochs
  from benchmarks import gpu_bench_steps as steps
  from configs import default as default_config
  from fkjax.config import record as run_config
  if not cfg["models"]:
    return "--models: no model given"
  for model in cfg["models"]:
    if default_config.model_preset(model) is None:
      return (f"--models: {model!r} is not a model of configs/default.py "
              "(resnet<depth> or en<members>resnet<depth>, e.g. resnet20, "
              "en2resnet20)")
  for flag, key in (("--precisions", "precisions"), ("--conv", "conv")):
    if not cfg[key]:
      return f"{flag}: none given"
  for flag, key, least in (("--sweep-sizes", "sweep_sizes", 1),
                           ("--batch-size", "batch_size", 1),
                           ("--attack-steps", "attack_steps", 0),
                           ("--repeats", "repeats", 1),
                           ("--warmup", "warmup", 0),
                           ("--matmul-size", "matmul_size", 1),
                           ("--copy-mib", "copy_mib", 1)):
    for n in (cfg[key] if isinstance(cfg[key], list) else [cfg[key]]):
      if n < least:
        return f"{flag}: {n}: at least {least}"
  for name in cfg["xla_variants"]:
    if name not in XLA_VARIANTS:
      return (f"--xla-variants: {name!r} is none of "
              f"{', '.join(XLA_VARIANTS)}")
  for variant in cfg["train_variants"]:
    try:
      epochs.parse_variant(variant)
    except ValueError as e:
      return f"--train-variants: {e}"
  for flag, key, values in (
      ("--models", "model", cfg["models"]),
      ("--precisions", "precision", cfg["precisions"]),
      ("--sweep-precision", "precision", [cfg["sweep_precision"]]),
      ("--conv", "conv", cfg["conv"])):
    for value in values:
      # a valid step but for the value checked
      spec = steps.StepSpec("resnet8", "float32", "auto",
                            cfg["attack_steps"], cfg["batch_size"])
      try:
        run_config.validate(steps.step_config(
            dataclasses.replace(spec, **{key: value})))
      except (ValueError, run_config.ConfigError) as e:
        return f"{flag}: {value!r}: {e}"
  return None


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


def _step_line(r: dict[str, Any]) -> str:
  what = f"PGD-{r['attack_steps']}" if r["attack_steps"] else "clean"
  flops = (f", {r['tflops_per_s']:.2f} TFLOP/s"
           if r.get("tflops_per_s") is not None else "")
  xla = f", XLA {r['xla_flag']}" if r.get("xla_flag") else ""
  return (f"{r['model']} {what} step, {r['precision']}, conv {r['conv']} "
          f"({r['conv_resolved']}){xla}, batch {r['batch_size']}: "
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
  """Runs :func:`gpu_bench_plan.plan`'s rows in order, within the budget,
  filling ``result`` (``save`` after each row); the workdirs in a
  temporary folder removed at the end."""
  scratch = tempfile.mkdtemp(prefix="fkjax_gpu_bench_")
  try:
    budget = plan_lib.Budget(cfg["max_seconds"], log, result["skipped"],
                             result["rows"])
    measure = Measure(cfg, args, result, log, scratch, budget)
    for row in plan_lib.plan(cfg):
      budget.run(row, plan_lib.estimate(row, cfg, result),
                 lambda row=row: measure(row))
      save()
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


class Measure:
  """``measure(row)``: runs one row of the plan, adds its figures to the
  result and its line to the log; returns them (None: nothing measured)."""

  def __init__(self, cfg: dict[str, Any], args: argparse.Namespace,
               result: dict[str, Any], log: Log, scratch: str,
               budget: plan_lib.Budget):
    from benchmarks import gpu_bench_epochs as epochs  # pylint: disable=import-outside-toplevel
    self.cfg, self.result, self.log = cfg, result, log
    self.scratch, self.budget = scratch, budget
    real, result["train_data"] = _train_data(cfg, args.data_dir)
    self.common = epochs.data_overrides(real, cfg["smoke"], args.data_dir)
    if cfg["smoke"]:
      # no compiled programs left in the user's cache by a smoke run
      self.common["compilation_cache_dir"] = os.path.join(scratch,
                                                          "jax_cache")

  def __call__(self, row: plan_lib.Row) -> Any:
    import jax  # pylint: disable=import-outside-toplevel
    try:
      return getattr(self, row.kind)(row)
    finally:
      jax.clear_caches()

  def _spec(self, row: plan_lib.Row, **changes: Any):
    from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
    return steps.StepSpec(row.model, row.precision, row.conv,
                          row.attack_steps, self.cfg["batch_size"],
                          **changes)

  def roofs(self, row: plan_lib.Row) -> dict[str, Any]:
    del row
    from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
    r = steps.roofs(self.cfg["matmul_size"], self.cfg["copy_mib"],
                    calls=3 if self.cfg["smoke"] else 10)
    self.result["roofs"] = r
    self.log(f"roofs: bf16 matmul {r['matmul_bf16_tflops']:.2f} TFLOP/s, "
             f"float32 {r['matmul_float32_tflops']:.2f} (JAX's default "
             f"precision), {r['matmul_float32_highest_tflops']:.2f} "
             f"(highest); copy {r['copy_gb_per_s']:.0f} GB/s")
    return r

  def step(self, row: plan_lib.Row) -> dict[str, Any]:
    from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
    r = steps.measure_step(self._spec(row), self.cfg["repeats"],
                           self.cfg["warmup"])
    r["group"] = row.group
    self.result["steps"].append(r)
    self.log(_step_line(r))
    return r

  def flags(self, row: plan_lib.Row) -> dict[str, Any]:
    from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
    flag = XLA_VARIANTS[row.variant]
    env = dict(USER_ENV, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_FLAGS=" ".join(
                   [os.environ.get("XLA_FLAGS", ""), flag]).strip())
    r = steps.measure_step_in_subprocess(
        self._spec(row), self.cfg["repeats"], self.cfg["warmup"], env=env,
        timeout_s=max(self.budget.left(), 1))
    base = next((s for s in self.result["steps"]
                 if (s["model"], s["precision"], s["conv"], s["attack_steps"])
                 == (row.model, row.precision, row.conv, row.attack_steps)),
                None)
    r.update(group=row.group, xla_variant=row.variant, xla_flag=flag)
    if base:
      r["baseline_step_ms_median"] = base["step_ms_median"]
      r["baseline_compile_s"] = base["compile_s"]
    self.result["xla_variants"].append(r)
    self.log(_step_line(r) + (
        f"; without it {base['step_ms_median']:.2f} ms, compile "
        f"{base['compile_s']:.1f} s" if base else ""))
    return r

  def sweep(self, row: plan_lib.Row) -> dict[str, Any]:
    from benchmarks import gpu_bench_steps as steps  # pylint: disable=import-outside-toplevel
    r = steps.measure_sweep(self._spec(row), row.runs, self.cfg["repeats"],
                            self.cfg["warmup"])
    single = next((s for s in self.result["steps"]
                   if (s["model"], s["precision"], s["attack_steps"])
                   == (row.model, row.precision, row.attack_steps)
                   and "xla_variant" not in s), None)
    if single:
      r["single_run_step_ms_median"] = single["step_ms_median"]
      r["speedup"] = (row.runs * single["step_ms_median"]
                      / r["step_ms_median"])
    self.result["sweeps"].append(r)
    self.log(f"sweep of {row.runs} {row.model} ({row.precision}): "
             f"{r['step_ms_median']:.2f} ms a step, {r['images_per_s']:.0f} "
             "images/s" + (f", {r['speedup']:.2f}x one run" if single
                           else ""))
    return r

  def train(self, row: plan_lib.Row) -> dict[str, Any]:
    from benchmarks import gpu_bench_epochs as epochs  # pylint: disable=import-outside-toplevel
    workdir = os.path.join(self.scratch,
                           f"train_{len(self.result['epochs'])}")
    r = epochs.run_variant(row.variant, workdir, self.common,
                           self.cfg["smoke"],
                           timeout_s=max(self.budget.left(), 1),
                           env=USER_ENV)
    self.result["epochs"].append(r)
    self.log(f"train.py {row.variant} on {r['devices']} device "
             f"({r['command']}): epoch 2 {r['epoch_s']:.2f} s wall "
             f"(training {r['train_s']:.2f} s, {r['train_images_per_s']:.0f}"
             f" images/s; validation {r['val_s']:.2f} s); epoch 1 "
             f"{r['epoch1_s']:.1f} s")
    if row.variant == self.cfg["train_variants"][0]:
      self.result["paper_run_minutes"] = epochs.paper_run_minutes(r)
      self.log(f"paper_run_minutes: {self.result['paper_run_minutes']:.1f} "
               f"(200 x epoch 2's wall time, train.py {row.variant} on one "
               "device)")
    return r


def summary_table(result: dict[str, Any]) -> str:
  """The figures in a few lines, for the end of the log."""
  lines = ["", "summary"]
  for r in result["steps"]:
    lines.append("  " + _step_line(r))
  for r in result["xla_variants"]:
    lines.append("  " + _step_line(r))
  for r in result["sweeps"]:
    lines.append(f"  sweep of {r['runs']} {r['model']}: "
                 + (f"{r['speedup']:.2f}x one run" if "speedup" in r
                    else f"{r['images_per_s']:.0f} images/s"))
  for r in result["epochs"]:
    lines.append(f"  train.py {r['variant']} on {r['devices']} device: "
                 f"epoch {r['epoch_s']:.2f} s wall (validation "
                 f"{r['val_s']:.2f} s)")
  if result.get("paper_run_minutes") is not None:
    lines.append(f"  paper_run_minutes: {result['paper_run_minutes']:.1f}")
  for name, why in result["skipped"].items():
    lines.append(f"  {name}: {why}")
  if result.get("stopped"):
    lines.append(f"  stopped by {result['stopped']}: the rows after the "
                 "last measured were not run")
  return "\n".join(lines)


class Stopped(BaseException):
  """SIGTERM (or SIGHUP): stop after saving what was measured."""


def _stop_on(signum: int, frame: Any) -> None:
  del frame
  raise Stopped(signal.Signals(signum).name)


# --smoke's programs, in this process and its subprocesses: XLA's cheapest
# compile (2.3x less CPU for a ResNet8 step); the times mean nothing there.
SMOKE_XLA_FLAGS = "--xla_backend_optimization_level=0"


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  cfg = settings(args)
  if cfg["smoke"]:
    for env in (os.environ, USER_ENV):
      env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""),
                                   SMOKE_XLA_FLAGS]).strip()
  kernels.apply_xla_flags()   # as train.py does, before JAX's backend starts
  import jax  # pylint: disable=import-outside-toplevel
  from absl import logging  # pylint: disable=import-outside-toplevel
  from benchmarks import gpu_bench_epochs as epochs  # pylint: disable=import-outside-toplevel
  from fkjax import atomic  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  problem = check_settings(cfg)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 2
  cfg["train_step"] = epochs.train_shape(
      epochs.find_cifar10(args.data_dir) is not None, cfg["smoke"],
      args.data_dir)
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
      "rows": [], "roofs": None, "steps": [], "sweeps": [], "epochs": [],
      "xla_variants": [],
      "train_data": None, "paper_run_minutes": None, "skipped": {},
      "stopped": None}
  env = result["environment"]
  log(f"fkjax gpu_bench {env['date']}, commit {env['commit']}: "
      f"{env['device_count']} x {env['device_kind']} ({env['platform']}), "
      f"jax {env['jax']}, jaxlib {env['jaxlib']}"
      + (" (--smoke: tiny sizes)" if cfg["smoke"] else ""))

  def save() -> None:
    atomic.write_json(json_path, result)

  before = {s: signal.signal(s, _stop_on)
            for s in (signal.SIGTERM, signal.SIGHUP)}
  code = 0
  try:
    measure_all(cfg, args, result, log, save)
  # The row under way is lost; every one before it is in the JSON.
  except KeyboardInterrupt:
    result["stopped"] = "SIGINT"
    raise   # cli.guard's one line, exit 130
  except Stopped as e:
    result["stopped"] = str(e)
    code = 128 + signal.Signals[str(e)].value
  finally:
    for s, handler in before.items():
      signal.signal(s, handler)
    if result["stopped"] is None and result["skipped"]:
      result["stopped"] = "--max-seconds" if any(
          r["status"] == "skipped" for r in result["rows"]) else None
    save()
    log(summary_table(result))
    log(f"\nwrote {json_path} and {log_path}")
    log.close()
  if code:
    return code
  measured = result["steps"] or result["epochs"]
  return 0 if measured else 1


INTERRUPTED = ("interrupted; what was measured so far is in the --json "
               "written after each row")


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
