"""The GPU-speed measurements, in one process that needs no arguments.

    python -m benchmarks.gpu_speed                 # a lent GPU: at most ~7 min
    SMOKE=1 python -m benchmarks.gpu_speed         # a CPU: tiny models

Every measurement trains through the library's own entry points
(``fkjax.training.train.train_and_evaluate`` for a run, ``fkjax.training.sweep.train_sweep``
for a sweep) on synthetic CIFAR-shaped data (speed does not depend on pixel
values; CIFAR-10 itself crosses to a lent machine only in parts), for two
epochs: epoch 1 holds the compilations, epoch 2's ``train_seconds`` and
``val_seconds`` (``metrics.jsonl``) are the steady figures. Two training
paths are measured in the same process:

* ``today``: the host's numpy batches, one step per dispatch, float32: the
  path every run took before the device pipeline (``config.training.
  data_pipeline="host"``, ``steps_per_dispatch=1``);
* ``new``: the configuration a GPU run gets by default (the split on the
  device, several steps per dispatch), float32 unless the row says bf16.

A full-size row trains on 45,000 images and validates on 5,000 (IFGSM^20,
the paper protocol's per-epoch validation); a short row trains on
``SHORT_STEPS`` batches and validates on ``SHORT_VAL`` images, and gives
images/s. The rows run in order of importance until ``BUDGET`` seconds
(default 420) are spent; a row that would not fit is skipped and says so.
``OUT`` (default ``/tmp/fkjax_gpu``) receives ``gpu_latest.json`` (rewritten
after every row, so a call stopped at its limit keeps what was measured) and
``gpu_speed_rows.jsonl`` (every row's raw figures); the last thing printed is
a short table.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

SMOKE = os.environ.get("SMOKE", "0") == "1"
BUDGET_S = float(os.environ.get("BUDGET", "420"))
OUT = os.environ.get("OUT", "/tmp/fkjax_gpu")

PAPER_EPOCHS = 200
TRAIN_IMAGES = 32 if SMOKE else 45000
VAL_IMAGES = 32 if SMOKE else 5000
BATCH = 16 if SMOKE else 128
SHORT_STEPS = 2 if SMOKE else 96
SHORT_VAL = 16 if SMOKE else 500

# The training path before the device pipeline, and what a GPU run gets now.
TODAY = {"training.data_pipeline": "host", "training.steps_per_dispatch": 1,
         "precision": "float32"}
NEW = {"training.data_pipeline": "device"}


@dataclasses.dataclass(frozen=True)
class Row:
  """One measurement: ``runs`` runs of ``model`` trained as one program."""
  name: str
  model: str
  path: str            # "today" or "new"
  runs: int = 1
  full: bool = False   # 45,000 images and the paper's validation
  precision: str = "float32"
  extra: tuple[tuple[str, Any], ...] = ()   # overrides beyond the path's
  guess_s: float = 60.0   # a pessimistic wall time on an H200, to skip early


ROWS = (
    Row("resnet20_new", "resnet20", "new", full=True, guess_s=55),
    Row("resnet20_today", "resnet20", "today", guess_s=35),
    Row("resnet20_sweep8", "resnet20", "new", runs=8, guess_s=60),
    Row("en2resnet20_new", "en2resnet20", "new", full=True, guess_s=70),
    Row("en2resnet20_today", "en2resnet20", "today", guess_s=40),
    Row("resnet20_sweep16", "resnet20", "new", runs=16, guess_s=70),
    Row("en2resnet20_sweep4", "en2resnet20", "new", runs=4, guess_s=60),
    Row("en2resnet20_sweep8", "en2resnet20", "new", runs=8, guess_s=75),
    Row("resnet20_new_bf16", "resnet20", "new", precision="bfloat16",
        guess_s=35),
    # the levers apart: the device pipeline alone, and more steps a dispatch
    Row("resnet20_device_k1", "resnet20", "new",
        extra=(("training.steps_per_dispatch", 1),), guess_s=35),
    Row("resnet20_device_k32", "resnet20", "new",
        extra=(("training.steps_per_dispatch", 32),), guess_s=35),
)
if SMOKE:
  # On a CPU: each path (today, new, sweep, ensemble, bf16) once, a sweep
  # of two runs.
  ROWS = tuple(dataclasses.replace(r, runs=min(r.runs, 2)) for r in ROWS
               if r.name in ("resnet20_new", "resnet20_today",
                             "resnet20_sweep8", "en2resnet20_new",
                             "resnet20_new_bf16"))


def _existing(overrides: dict[str, Any], config) -> dict[str, Any]:
  """The overrides whose keys the config has (the measured code may predate
  a key: then its only path is today's)."""
  kept = {}
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node.get(p) if node is not None else None
    if node is not None and leaf in node:
      kept[key] = value
  return kept


def row_configs(row: Row) -> list[Any]:
  """The configs of ``row``'s runs (seeds 0..runs-1, one data order)."""
  from configs import default  # pylint: disable=import-outside-toplevel
  from fkjax.config import keys as config_keys  # pylint: disable=import-outside-toplevel
  from fkjax.training.sweep import spec  # pylint: disable=import-outside-toplevel
  base = default.get_config(row.model)
  steps = None if row.full else SHORT_STEPS
  train = TRAIN_IMAGES if steps is None else steps * BATCH
  val = VAL_IMAGES if row.full else SHORT_VAL
  base.dataset.source = "synthetic"
  base.dataset.synthetic_sizes = (train + val, BATCH)
  base.dataset.val_size = val
  base.training.num_epochs = 2
  base.training.batch_size = BATCH
  base.validation.num_examples = 0
  base.eval.final_attacks = ""
  base.progress = False
  if SMOKE:
    base.model.depth = 8
    base.attack.num_steps = 1
    base.validation.attack_steps = 1
    base.validation.batch_size = BATCH
  overrides = dict(TODAY if row.path == "today" else NEW)
  overrides.update(row.extra)
  if row.precision != "float32":
    overrides["precision"] = row.precision
  kept = _existing(overrides, base)
  for key, value in kept.items():
    config_keys.set_value(base, key, value)
  if row.precision != "float32" and "precision" not in kept:
    raise RuntimeError("this fkjax has no config.precision")
  configs = []
  for seed in range(row.runs):
    c = base.copy_and_resolve_references()
    c.seed = seed
    configs.append(c)
  return spec.with_data_seed(configs, "shared") if row.runs > 1 else configs


def _last_epoch(workdir: str) -> dict[str, Any]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  epochs = [r for r in records if "train_seconds" in r]
  return epochs[-1]


def measure(row: Row, root: str) -> dict[str, Any]:
  """Trains ``row`` for two epochs; its steady figures from epoch 2."""
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax.training import sweep  # pylint: disable=import-outside-toplevel
  from fkjax.training import train  # pylint: disable=import-outside-toplevel
  configs = row_configs(row)
  workdirs = [os.path.join(root, row.name, f"run{i}")
              for i in range(row.runs)]
  start = time.perf_counter()
  if row.runs == 1:
    train.train_and_evaluate(configs[0], workdirs[0])
  else:
    sweep.train_sweep(configs, workdirs, data_order="shared")
  wall = time.perf_counter() - start
  last = _last_epoch(workdirs[0])
  c = configs[0]
  images = c.dataset.synthetic_sizes[0] - c.dataset.val_size
  result = {
      "row": row.name, "model": row.model, "path": row.path,
      "runs": row.runs, "precision": row.precision, "train_images": images,
      "epoch_s": last["train_seconds"], "val_s": last.get("val_seconds"),
      "val_images": c.dataset.val_size,
      "images_per_s": row.runs * images / last["train_seconds"],
      "wall_s": wall,
      "overrides": _existing({**(TODAY if row.path == "today" else NEW),
                              **dict(row.extra),
                              "precision": row.precision}, c),
  }
  jax.clear_caches()
  return result


def bf16_matmul_tflops() -> float:
  """Dense bf16 matrix products on random data, the card's ceiling."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  n = 256 if SMOKE else 8192
  a, b = (jax.random.normal(k, (n, n), jnp.bfloat16)
          for k in jax.random.split(jax.random.key(0)))
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  f(a, b).block_until_ready()
  reps = 10
  start = time.perf_counter()
  for _ in range(reps):
    out = f(a, b)
  out.block_until_ready()
  return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e12


def summarise(rows: dict[str, dict[str, Any]], meta: dict[str, Any]
              ) -> dict[str, Any]:
  """``gpu_latest.json``'s fields from the rows measured so far."""
  def epoch_at_full_size(name: str) -> float | None:
    r = rows.get(name)
    return TRAIN_IMAGES * r["runs"] / r["images_per_s"] if r else None

  def minutes(model: str) -> float | None:
    r = rows.get(f"{model}_new")
    if not r:
      return None
    return PAPER_EPOCHS * (r["epoch_s"] + (r["val_s"] or 0.0)) / 60

  def speedup(name: str, base: str) -> float | None:
    if name in rows and base in rows:
      return rows[name]["images_per_s"] / rows[base]["images_per_s"]
    return None

  out = dict(meta)
  out.update({
      "resnet20_epoch_s": (rows["resnet20_new"]["epoch_s"]
                           if "resnet20_new" in rows else None),
      "en2resnet20_epoch_s": (rows["en2resnet20_new"]["epoch_s"]
                              if "en2resnet20_new" in rows else None),
      "resnet20_sweep8_speedup": speedup("resnet20_sweep8", "resnet20_today"),
      "paper_run_minutes": {"resnet20": minutes("resnet20"),
                            "en2resnet20": minutes("en2resnet20")},
      "today": {"resnet20_epoch_s": epoch_at_full_size("resnet20_today"),
                "en2resnet20_epoch_s":
                    epoch_at_full_size("en2resnet20_today")},
      "speedups_over_today": {
          name: speedup(name, "resnet20_today" if r["model"] == "resnet20"
                        else "en2resnet20_today")
          for name, r in rows.items() if r["path"] == "new"},
      "rows": list(rows.values()),
  })
  return out


def _format(value: Any, digits: int = 2) -> str:
  return "-" if value is None else f"{value:.{digits}f}"


def table(summary: dict[str, Any]) -> str:
  """The short table printed last."""
  lines = [f"{'row':<22} {'runs':>4} {'epoch s':>8} {'val s':>6} "
           f"{'images/s':>9} {'x today':>8}",
           "-" * 62]
  for r in summary["rows"]:
    x = summary["speedups_over_today"].get(r["row"])
    lines.append(f"{r['row']:<22} {r['runs']:>4} {_format(r['epoch_s']):>8} "
                 f"{_format(r['val_s']):>6} {r['images_per_s']:>9.0f} "
                 f"{_format(x):>8}")
  for name, reason in summary.get("skipped", {}).items():
    lines.append(f"{name:<22} skipped: {reason}")
  m = summary["paper_run_minutes"]
  lines += [
      f"bf16 matmul: {_format(summary['bf16_matmul_tflops'], 3)} TFLOP/s; "
      f"a paper run (200 epochs + validation): ResNet20 "
      f"{_format(m['resnet20'], 1)} min, En2ResNet20 "
      f"{_format(m['en2resnet20'], 1)} min; sweep of 8 ResNet20 "
      f"{_format(summary['resnet20_sweep8_speedup'])}x one run of today's "
      "path"]
  return "\n".join(lines)


def _commit() -> str | None:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def main() -> int:
  deadline = time.monotonic() + BUDGET_S
  from fkjax import kernels  # pylint: disable=import-outside-toplevel
  kernels.apply_xla_flags()   # as train.py does, before JAX's backend starts
  import jax  # pylint: disable=import-outside-toplevel
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  from fkjax.training import devices  # pylint: disable=import-outside-toplevel
  os.makedirs(OUT, exist_ok=True)
  meta = {"device": jax.devices()[0].device_kind,
          "devices": devices.describe_devices(),
          "date": datetime.date.today().isoformat(), "commit": _commit(),
          "smoke": SMOKE, "batch_size": BATCH,
          "bf16_matmul_tflops": bf16_matmul_tflops(), "skipped": {}}
  print(f"bf16 matmul: {meta['bf16_matmul_tflops']:.1f} TFLOP/s", flush=True)
  rows: dict[str, dict[str, Any]] = {}
  root = tempfile.mkdtemp(prefix="fkjax_gpu_speed_")
  raw = open(os.path.join(OUT, "gpu_speed_rows.jsonl"), "w")
  try:
    for row in ROWS:
      left = deadline - time.monotonic()
      if left < (5 if SMOKE else row.guess_s):
        meta["skipped"][row.name] = f"{left:.0f} s of the budget left"
        continue
      print(f"=== {row.name}: {row.runs} x {row.model}, {row.path} path, "
            f"{row.precision}", flush=True)
      try:
        result = measure(row, root)
      except Exception as e:  # pylint: disable=broad-except
        # One failed row must not lose the others' figures.
        meta["skipped"][row.name] = f"{type(e).__name__}: {e}"[:300]
        print(f"  failed: {meta['skipped'][row.name]}", flush=True)
        continue
      rows[row.name] = result
      raw.write(json.dumps(result) + "\n")
      raw.flush()
      print(f"  epoch {result['epoch_s']:.2f} s, "
            f"{result['images_per_s']:.0f} images/s, "
            f"wall {result['wall_s']:.0f} s", flush=True)
      with open(os.path.join(OUT, "gpu_latest.json"), "w") as f:
        json.dump(summarise(rows, meta), f, indent=1)
  finally:
    raw.close()
    shutil.rmtree(root, ignore_errors=True)
  summary = summarise(rows, meta)
  with open(os.path.join(OUT, "gpu_latest.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(table(summary), flush=True)
  return 0 if rows else 1


if __name__ == "__main__":
  sys.exit(main())
