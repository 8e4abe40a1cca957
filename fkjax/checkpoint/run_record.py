"""Each checkpoint records the config of the run that saved it.

A run's ``config.json`` says what it trains, and ``train.py`` refuses to
resume it with another config. With ``config.json`` deleted, a resume with
another ``training.batch_size`` used to continue the old batch size's
checkpoint, repeat an epoch, and write a ``config.json`` claiming the new
one. So every save copies the run's ``config.json``, as it stands, into the
step's own metadata file (beside the arrays' digests, committed with them);
:func:`recorded_config` reads it back from the latest step that has one, for
``fkjax.config.record.check_same_run`` to compare. Reading needs no JAX.
"""
from __future__ import annotations

import json
import os
from typing import Any

# orbax's per-step metadata file, and fkjax's entry in its custom metadata
# (the same as fkjax.checkpoint.digests').
STEP_METADATA = "_CHECKPOINT_METADATA"
METADATA_KEY = "fkjax"
CONFIG_KEY = "run_config"
CONFIG_FILE = "config.json"   # fkjax.config.record's


def of_workdir(workdir: str) -> dict[str, Any]:
  """What a save in ``workdir`` adds to fkjax's metadata entry: the run's
  ``config.json`` (nothing where there is none, or it is not JSON)."""
  try:
    with open(os.path.join(workdir, CONFIG_FILE)) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return {}
  return {CONFIG_KEY: config} if isinstance(config, dict) else {}


def _of_step(step_dir: str) -> dict[str, Any] | None:
  try:
    with open(os.path.join(step_dir, STEP_METADATA)) as f:
      metadata = json.load(f)
    config = metadata["custom_metadata"][METADATA_KEY][CONFIG_KEY]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return config if isinstance(config, dict) else None


def recorded_config(workdir: str) -> tuple[int, dict[str, Any]] | None:
  """``(step, config)`` of the latest complete checkpoint of ``workdir``
  that records its run's config; None where none does (checkpoints of an
  fkjax from before the record)."""
  root = os.path.join(workdir, "checkpoints")
  try:
    steps = sorted((int(n) for n in os.listdir(root) if n.isdigit()),
                   reverse=True)
  except OSError:
    return None
  for step in steps:
    config = _of_step(os.path.join(root, str(step)))
    if config is not None:
      return step, config
  return None
