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
from typing import Any, Iterator

from fkjax import readback

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
  """The config the step's metadata records; None where it records none
  (an fkjax from before the record). A metadata file that is not whole
  JSON raises :class:`fkjax.readback.DamagedFileError`, naming it."""
  metadata = readback.read_json(os.path.join(step_dir, STEP_METADATA),
                                what="a checkpoint's metadata")
  config = ((metadata or {}).get("custom_metadata") or {})
  config = config.get(METADATA_KEY) if isinstance(config, dict) else None
  config = config.get(CONFIG_KEY) if isinstance(config, dict) else None
  return config if isinstance(config, dict) else None


def recorded_configs(workdir: str) -> Iterator[tuple[int, dict[str, Any]]]:
  """``(step, config)`` of every complete checkpoint of ``workdir`` that
  records its run's config, the latest first."""
  root = os.path.join(workdir, "checkpoints")
  try:
    steps = sorted((int(n) for n in os.listdir(root) if n.isdigit()),
                   reverse=True)
  except OSError:
    return
  for step in steps:
    config = _of_step(os.path.join(root, str(step)))
    if config is not None:
      yield step, config


def recorded_config(workdir: str) -> tuple[int, dict[str, Any]] | None:
  """``(step, config)`` of the latest complete checkpoint of ``workdir``
  that records its run's config; None where none does (checkpoints of an
  fkjax from before the record)."""
  return next(recorded_configs(workdir), None)
