"""One finished ``python train.py --config=configs/tiny.py`` run, trained
once for a whole test session and read by every test file that needs one.

Under pytest-xdist the workers share the session's temporary root: the first
worker to ask trains the run there while holding a lock, the others wait on
the lock (no CPU) and read the finished run. Tests never write into it: each
file copies it (:func:`copy`) before running tools on it.
"""
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TEST_CACHE_DIR
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
# One device, a checkpoint every 2 of the 12 steps (3 epochs of 4).
ONE_DEVICE = ("--config.num_devices=1",
              "--config.training.checkpoint_every_steps=2")
# What the run's subprocesses compiled is in the tests' shared cache.
CACHE = TEST_CACHE_DIR


def shared_root(basetemp: Path) -> Path:
  """The directory every process of this test session sees: the workers'
  common parent under xdist, the session's own root without it."""
  return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else (
      basetemp)


def train_once(root: Path) -> dict:
  """The run under ``root/tiny_run`` (trained by the first caller of the
  session): its workdir and what train.py printed."""
  workdir, log = root / "tiny_run", root / "tiny_run.log"
  with open(root / "tiny_run.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
    if not log.exists():
      shutil.rmtree(workdir, ignore_errors=True)   # an earlier failed try
      proc = subprocess.run(
          [sys.executable, "train.py", "--config=configs/tiny.py",
           f"--workdir={workdir}", *ONE_DEVICE], cwd=REPO,
          env=subprocess_env(CACHE), capture_output=True, text=True,
          timeout=TIMEOUT_S)
      if proc.returncode != 0:
        raise AssertionError(f"train.py failed:\n{proc.stdout}\n{proc.stderr}")
      log.write_text(proc.stdout)   # written last: the run is complete
  return {"workdir": workdir, "log": log.read_text()}


def copy(run: dict, to: Path) -> Path:
  """A private copy of the shared run's workdir at ``to``."""
  shutil.copytree(run["workdir"], to)
  return to
