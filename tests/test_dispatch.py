"""Data pipelines and steps per dispatch (fkjax.training.dispatch) change no state.

tests/dispatch_equivalence.py trains two epochs of the tiny config through
today's step loop and through the step programs (the host or the device
pipeline, 1 or 3 steps a dispatch, resumed mid-epoch, and a 2-run sweep
with a batch stream per run): on CPU every state is bit for bit the
loop's.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from configs import tiny
from fkjax.training import dispatch
from fkjax.config.record import ConfigError
from tests.subprocess_env import subprocess_env

REPO = Path(__file__).resolve().parents[1]


def _config():
  config = tiny.get_config()
  config.num_devices = 1
  return config


# Two epochs compiled six ways in a subprocess, under train.py's own XLA
# flags (kernels.apply_xla_flags): the slow set's.
@pytest.mark.slow
def test_every_pipeline_and_dispatch_gives_todays_states():
  env = subprocess_env()
  env["XLA_FLAGS"] = ""   # kernels.apply_xla_flags adds fkjax's
  proc = subprocess.run(
      [sys.executable, "-m", "tests.dispatch_equivalence"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result.pop("steps_per_epoch") == 4
  # bit for bit, and the per-step losses read from the dispatches too
  for variant in ("host_1", "device_1", "device_3"):
    assert result[variant] == [0.0, True], variant
  assert result["resumed"] == [0.0, [6]]
  assert result["sweep_device_2"] == 0.0


def test_auto_resolves_by_platform():
  config = _config()
  assert dispatch.resolve_pipeline(config, "cpu", 1) == "host"
  assert dispatch.resolve_pipeline(config, "gpu", 1) == "device"
  assert dispatch.resolve_pipeline(config, "gpu", 2) == "host"
  assert dispatch.resolve_steps_per_dispatch(config, "cpu") == 1
  assert dispatch.resolve_steps_per_dispatch(config, "gpu") == 8
  config.training.steps_per_dispatch = 4
  assert dispatch.resolve_steps_per_dispatch(config, "cpu") == 4
  config.training.data_pipeline = "device"
  assert dispatch.resolve_pipeline(config, "cpu", 1) == "device"
  with pytest.raises(ConfigError, match="multi-process"):
    dispatch.resolve_pipeline(config, "gpu", 2)


def test_scan_limit_leaves_out_a_smaller_last_batch():
  assert dispatch.scan_limit(64, 16, drop_last=False) == 4
  assert dispatch.scan_limit(70, 16, drop_last=False) == 4   # 5 steps
  assert dispatch.scan_limit(70, 16, drop_last=True) == 4
