"""Whole epochs through ``train.py``, for ``benchmarks.gpu_bench``.

Each variant is ``python train.py --config=configs/default.py`` (the
paper's En2ResNet20 protocol) for two epochs in a fresh workdir, in a
subprocess as a user runs it, on one device (``config.num_devices=1``,
as the step rows: the figures are one GPU's on a host with several), with
only the data pipeline set (``auto`` leaves it to the config: on GPUs the
split kept on the device). Epoch 1 holds the compilations; epoch 2's
``epoch_seconds`` (its wall time: steps, loss check, validation and epoch
1's checkpoint save), ``train_seconds``, ``train_images_per_second`` and
``val_seconds`` (``metrics.jsonl``) are the figures. The final test
evaluation is turned off (``eval.final_attacks=""``): it is not part of an
epoch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from fkjax.data import cifar_binary
from fkjax.data import fetch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_EPOCHS = 200

# Tiny runs of the same protocol (``--smoke``): a ResNet8, a few images.
SMOKE_OVERRIDES = {
    "training.batch_size": 8, "attack.num_steps": 2,
    "validation.attack_steps": 1, "validation.batch_size": 8,
    "dataset.val_size": 8,
}
SMOKE_REAL = {"dataset.subset_per_class": 3, "dataset.test_subset_per_class": 1}
SMOKE_SYNTHETIC = {"dataset.synthetic_sizes": (32, 8)}


def parse_variant(text: str) -> dict[str, Any]:
  """``auto``, ``host`` or ``device`` -> the config overrides
  (``config.training.data_pipeline``; ``host``: NumPy batches copied each
  step, ``device``: the split kept on the device)."""
  if text == "auto":
    return {}
  if text not in ("host", "device"):
    raise ValueError(f"train variant {text!r}: expected auto, host or "
                     "device (config.training.data_pipeline)")
  return {"training.data_pipeline": text}


def find_cifar10(data_dir: str | None) -> str | None:
  """Where CIFAR-10 is (``config.dataset.data_dir``'s resolution), or None."""
  found = cifar_binary.locate(fetch.resolve_data_dir(data_dir), "cifar10")
  return found[1] if found else None


def data_overrides(real: bool, smoke: bool, data_dir: str | None
                   ) -> dict[str, Any]:
  """The dataset keys of a variant: CIFAR-10 as ``train.py`` reads it, or
  synthetic CIFAR-shaped images (the speed does not depend on pixels)."""
  out: dict[str, Any] = {}
  if data_dir:
    out["dataset.data_dir"] = data_dir
  if real:
    out["dataset.download"] = False
  else:
    out["dataset.source"] = "synthetic"
  if smoke:
    out.update(SMOKE_OVERRIDES)
    out.update(SMOKE_REAL if real else SMOKE_SYNTHETIC)
  return out


def _flag(key: str, value: Any) -> str:
  if isinstance(value, tuple):
    value = "(" + ",".join(str(v) for v in value) + ",)"
  return f"--config.{key}={value}"


def command(workdir: str, overrides: dict[str, Any], smoke: bool
            ) -> list[str]:
  """The ``train.py`` command line of a variant."""
  config = "configs/default.py" + (":resnet8" if smoke else "")
  values = {"training.num_epochs": 2, "eval.final_attacks": "",
            "progress": False, "num_devices": 1, **overrides}
  return [sys.executable, "train.py", f"--config={config}",
          f"--workdir={workdir}", *(_flag(k, v) for k, v in values.items())]


def _epochs(workdir: str) -> list[dict[str, Any]]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if "train_seconds" in r]


def run_variant(variant: str, workdir: str, common: dict[str, Any],
                smoke: bool, timeout_s: float,
                env: dict[str, str] | None = None) -> dict[str, Any]:
  """Trains ``variant`` for two epochs (``common``: the overrides of every
  variant, e.g. :func:`data_overrides`; ``env``: train.py's environment,
  default this process's); its figures from epoch 2.

  Raises:
    RuntimeError: train.py failed or ran past ``timeout_s`` (with the end
      of its output).
  """
  overrides = {**common, **parse_variant(variant)}
  argv = command(workdir, overrides, smoke)
  start = time.perf_counter()
  try:
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"train.py ran past {timeout_s:.0f} s") from e
  wall = time.perf_counter() - start
  if proc.returncode:
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
    raise RuntimeError(f"train.py exited {proc.returncode}: "
                       + " | ".join(tail))
  first, last = _epochs(workdir)[:2]
  return {
      "variant": variant,
      "overrides": parse_variant(variant),
      "command": " ".join(argv[1:]),
      "devices": 1,
      "epoch1_s": first["epoch_seconds"],
      "epoch_s": last["epoch_seconds"],
      "train_s": last["train_seconds"],
      "train_images_per_s": last["train_images_per_second"],
      "val_s": last["val_seconds"],
      "wall_s": wall,
  }


def paper_run_minutes(epoch: dict[str, Any]) -> float:
  """The paper's 200 epochs at ``epoch``'s wall time on one device
  (compilation and the final test evaluation not counted)."""
  return PAPER_EPOCHS * epoch["epoch_s"] / 60


def train_shape(real: bool, smoke: bool, data_dir: str | None
                ) -> dict[str, Any]:
  """What a variant's cost depends on (``gpu_bench_plan.estimate``): its
  model and precision, batch, steps an epoch, validation batches and
  attack iterations."""
  from configs import default as default_config  # pylint: disable=import-outside-toplevel
  from fkjax.config import keys as config_keys  # pylint: disable=import-outside-toplevel
  config = default_config.get_config("resnet8" if smoke else "")
  for key, value in data_overrides(real, smoke, data_dir).items():
    config_keys.set_value(config, key, value)
  d = config.dataset
  per_class = d.get("subset_per_class")
  images = (10 * per_class if per_class else 50000) if real else (
      d.synthetic_sizes[0])
  val = d.val_size or (10000 if real else d.synthetic_sizes[1])
  batch = config.training.batch_size
  return {"model": ("resnet8" if smoke else
                    f"en{config.model.ensemble_size}resnet"
                    f"{config.model.depth}"),
          "precision": config.precision, "batch_size": batch,
          "steps_per_epoch": max(1, (images - d.val_size) // batch),
          "val_batches": max(1, val // config.validation.batch_size),
          "val_attack_steps": config.validation.attack_steps}
