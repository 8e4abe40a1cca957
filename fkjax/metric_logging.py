"""Per-epoch metrics: ``<workdir>/metrics.jsonl`` and TensorBoard event files.

TensorBoard files are written with tensorboardX, a small pure-Python writer:
CLU's metric writers need TensorFlow for TensorBoard summaries, which fkjax
does not otherwise require. ``tensorboard --logdir <workdir>/tensorboard``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping


class MetricLogger:
  """Appends metrics to JSON lines and TensorBoard; prints text lines."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # imported lazily: slow import
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    record = {"step": step, "time": time.time(), **metrics}
    with open(self._path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for name, value in metrics.items():
      if isinstance(value, (int, float)):
        self._tb.add_scalar(name, value, step)
    self._tb.flush()

  def log_text(self, text: str) -> None:
    if self.enabled:
      print(text, file=sys.stdout, flush=True)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """The records of ``metrics.jsonl`` (a resumed run may repeat an epoch)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def format_epoch(m: Mapping[str, Any]) -> str:
  """One human-readable line per epoch."""
  parts = [f"epoch {m['epoch']}", f"lr {m['learning_rate']:.4g}"]
  special = ("train_seconds", "train_images_per_second")
  for k, v in m.items():
    if k.startswith(("train_", "val_")) and k not in special:
      parts.append(f"{k} {v:.4f}" if "loss" in k else f"{k} {v:.2f}")
  parts += [f"sparsity {m['weight_sparsity']:.2f}%",
            f"channel sparsity {m['channel_sparsity']:.2f}%",
            f"train {m['train_seconds']:.1f}s"]
  if m.get("train_images_per_second"):
    parts[-1] += f" ({m['train_images_per_second']:.0f} images/s)"
  return " | ".join(parts)
