"""Every batch a run uses works on any number of devices: evaluation
batches are padded to a multiple of the devices and computed split over
them on their real rows alone (the same numbers as on one device); a
training batch that cannot split evenly is refused before the first step,
naming its setting (tests/test_cli.py). The slow set checks a run's
validation here, and runs train.py and eval.py over 8 devices end to end
(tests/test_train_slow.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def eight_devices():
  """tests/uneven_devices.py's report: batches of 20 and 17 real rows."""
  env = subprocess_env(None, devices=8)
  proc = subprocess.run([sys.executable, "-m", "tests.uneven_devices"],
                        cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_batch_that_does_not_divide_gives_the_one_device_numbers(
    eight_devices):
  assert eight_devices["num_devices"] == 8
  # Natural, PGD and NAttack (its image groups and population chunks), on
  # a model whose noise scales with the batch's standard deviation: a
  # padding row reaching it would move the real rows' predictions.
  one, split = eight_devices["one_device"], eight_devices["devices"]
  assert set(one) == {"natural", "pgd", "nattack"}
  for name in one:
    assert len(split[name]) == 37
    assert split[name] == one[name], name
  assert 0 < sum(one["pgd"]) < sum(one["natural"]) < 37


def test_each_device_computes_its_part_of_the_rows(eight_devices):
  # One device: the whole batches (20 and 17 rows). Eight: at most
  # ceil(20 / 8) = 3 rows each, not the whole batch on every device.
  assert eight_devices["one_device_dot_rows"] == [17, 20]
  assert eight_devices["devices_dot_rows"] == [3]


@pytest.mark.slow
def test_validation_splits_a_batch_that_does_not_divide():
  """A run's validation batch of 30 rows on 8 devices: 4 rows a device
  (not the whole batch on each), the one-device accuracies."""
  env = subprocess_env(None, devices=8)
  env["FKJAX_KERNELS_PLATFORM"] = "gpu"   # XLA's convolutions, as a GPU's
  proc = subprocess.run(
      [sys.executable, "-m", "tests.uneven_devices", "validation"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["8"]["conv_rows"] == [4]
  assert report["1"]["conv_rows"] == [30]
  assert report["8"]["accuracy"] == report["1"]["accuracy"]
  assert set(report["1"]["accuracy"]) == {"natural", "pgd2"}
