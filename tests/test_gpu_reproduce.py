"""benchmarks/gpu_reproduce.sh: what a lent GPU machine sends home."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _members(path):
  with tarfile.open(path) as tar:
    return {m.name for m in tar.getmembers() if m.isfile()}


def test_finished_runs_and_unfinished_workdirs_are_packed(tmp_path):
  kept = tmp_path / "results/tiny/runs/table5/row_seed0"
  kept.mkdir(parents=True)
  (kept / "reproduce_run.json").write_text('{"done": true}')
  root = tmp_path / "workdirs/reproduce/tiny/table5"
  (root / "done_seed0").mkdir(parents=True)
  (root / "done_seed0/reproduce_run.json").write_text('{"done": true}')
  (root / "stopped_seed0/checkpoints/352").mkdir(parents=True)
  (root / "stopped_seed0/checkpoints/352/state").write_text("weights")
  out = tmp_path / "out"
  env = {**os.environ, "OUT": str(out), "SCALE": "tiny",
         "FKJAX_DATA_DIR": str(tmp_path), "PY": sys.executable}
  # a job that ends at once: only the packing is under test
  proc = subprocess.run(
      ["bash", str(REPO / "benchmarks/gpu_reproduce.sh"), "--help"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "results/tiny/runs/table5/row_seed0/reproduce_run.json" in _members(
      out / "runs.tgz")
  packed = _members(out / "workdirs.tgz")
  assert packed == {
      "workdirs/reproduce/tiny/table5/stopped_seed0/checkpoints/352/state"}


def test_data_dir_is_required(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "FKJAX_DATA_DIR"}
  proc = subprocess.run(
      ["bash", str(REPO / "benchmarks/gpu_reproduce.sh"), "--help"],
      cwd=tmp_path, env={**env, "OUT": str(tmp_path / "out")},
      capture_output=True, text=True, timeout=60)
  assert proc.returncode != 0
  assert "set FKJAX_DATA_DIR" in proc.stderr
