"""The data pipelines (fkjax.training.input_pipeline) change no state.

tests/dispatch_equivalence.py trains two epochs of the tiny config through
a plain loop and through the training loop's step program (the host or the
device pipeline, resumed mid-epoch, and a 2-run sweep with a batch stream
per run): on CPU every state is bit for bit the plain loop's.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from configs import tiny
from fkjax.training import input_pipeline
from fkjax.config import record as run_config
from fkjax.config.record import ConfigError
from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]


def _config():
  config = tiny.get_config()
  config.num_devices = 1
  return config


# Two epochs compiled several ways in a subprocess, under train.py's own XLA
# flags (kernels.apply_xla_flags): the slow set's.
@pytest.mark.slow
def test_every_pipeline_gives_the_plain_loops_states():
  env = subprocess_env()
  env["XLA_FLAGS"] = ""   # kernels.apply_xla_flags adds fkjax's
  proc = subprocess.run(
      [sys.executable, "-m", "tests.dispatch_equivalence"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result.pop("steps_per_epoch") == 4
  # bit for bit, and the per-step losses read from the dispatches too
  for variant in ("host_1", "device_1"):
    assert result[variant] == [0.0, True], variant
  assert result["resumed"] == [0.0, [6]]
  assert result["sweep_device_2"] == 0.0


def test_auto_resolves_by_platform():
  config = _config()
  assert input_pipeline.resolve_pipeline(config, "cpu", 1) == "host"
  assert input_pipeline.resolve_pipeline(config, "gpu", 1) == "device"
  assert input_pipeline.resolve_pipeline(config, "gpu", 2) == "host"
  config.training.data_pipeline = "device"
  assert input_pipeline.resolve_pipeline(config, "cpu", 1) == "device"
  with pytest.raises(ConfigError, match="multi-process"):
    input_pipeline.resolve_pipeline(config, "gpu", 2)


def test_old_configs_with_steps_per_dispatch_still_load():
  # every step is its own dispatch; the key is accepted (older configs)
  config = _config()
  config.training.steps_per_dispatch = 8
  run_config.validate(config)
  assert input_pipeline.describe("host", config) == (
      "data pipeline host, precision float32 (matmuls and convolutions at "
      "HIGHEST)")
