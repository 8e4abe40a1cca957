"""benchmarks/gpu_reproduce.sh: what a lent GPU machine sends home."""
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _members(path):
  with tarfile.open(path) as tar:
    return {m.name for m in tar.getmembers() if m.isfile()}


def _call(tmp_path, job, **env):
  out = tmp_path / "out"
  env = {**os.environ, "OUT": str(out), "SCALE": "tiny",
         "FKJAX_DATA_DIR": str(tmp_path), **env}
  proc = subprocess.run(
      ["bash", str(REPO / "benchmarks/gpu_reproduce.sh"), job],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return out, proc.stdout


def _finishing_python(tmp_path, results="tiny"):
  """A stand-in for python that "finishes" a run of the table it is given,
  under ``results/<results>``, recording its arguments in the log."""
  script = tmp_path / "python"
  script.write_text(
      "#!/bin/bash\n"
      "echo \"args: $*\"\n"
      f"d=results/{results}/runs/table5/$4_seed0\n"
      "mkdir -p $d && echo '{\"done\": true}' > $d/reproduce_run.json\n")
  script.chmod(0o755)
  return str(script)


def test_runs_finished_in_the_call_and_unfinished_workdirs_are_packed(
    tmp_path):
  for name in ("old", "updated"):
    brought = tmp_path / f"results/tiny/runs/table5/{name}_seed0"
    brought.mkdir(parents=True)
    (brought / "reproduce_run.json").write_text('{"done": true}')
  root = tmp_path / "workdirs/reproduce/tiny/table5"
  (root / "done_seed0").mkdir(parents=True)
  (root / "done_seed0/reproduce_run.json").write_text('{"done": true}')
  (root / "stopped_seed0/checkpoints/352").mkdir(parents=True)
  (root / "stopped_seed0/checkpoints/352/state").write_text("weights")
  out, _ = _call(tmp_path, "table5 new; table5 updated",
                 PY=_finishing_python(tmp_path))
  runs = _members(out / "runs.tgz")
  # what the checkout brought unchanged stays home; what finished or was
  # updated here (an extra evaluation added) comes back
  for name in ("new", "updated"):
    assert f"results/tiny/runs/table5/{name}_seed0/reproduce_run.json" in runs
  assert not any("old_seed0" in m for m in runs)
  assert any(m.endswith("job1.log") for m in runs)
  assert _members(out / "workdirs.tgz") == {
      "workdirs/reproduce/tiny/table5/stopped_seed0/checkpoints/352/state"}


def test_a_large_file_comes_back_in_parts(tmp_path):
  state = tmp_path / "workdirs/reproduce/tiny/table5/stopped_seed0/state"
  state.parent.mkdir(parents=True)
  state.write_bytes(os.urandom(50_000))   # incompressible
  out, log = _call(tmp_path, "--help", PY=sys.executable, PART_BYTES="20000")
  parts = sorted(out.glob("workdirs.tgz.part-*"))
  assert [p.name for p in parts] == [f"workdirs.tgz.part-0{i}"
                                     for i in range(3)]
  assert all(p.stat().st_size <= 20000 for p in parts)
  assert not (out / "workdirs.tgz").exists()
  assert "workdirs.tgz cut into 3 parts" in log
  whole = tmp_path / "whole.tgz"
  whole.write_bytes(b"".join(p.read_bytes() for p in parts))
  with tarfile.open(whole) as tar:
    assert tar.extractfile(
        "workdirs/reproduce/tiny/table5/stopped_seed0/state").read() == (
            state.read_bytes())


def test_data_dir_is_required(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "FKJAX_DATA_DIR"}
  proc = subprocess.run(
      ["bash", str(REPO / "benchmarks/gpu_reproduce.sh"), "--help"],
      cwd=tmp_path, env={**env, "OUT": str(tmp_path / "out")},
      capture_output=True, text=True, timeout=60)
  assert proc.returncode != 0
  assert "set FKJAX_DATA_DIR" in proc.stderr


def test_a_variants_runs_are_run_and_packed_under_its_name(tmp_path):
  stopped = tmp_path / "workdirs/reproduce/tiny-long/table5/stopped_seed0"
  stopped.mkdir(parents=True)
  (stopped / "state").write_text("weights")
  out, _ = _call(tmp_path, "table5 new", VARIANT="long",
                 PY=_finishing_python(tmp_path, results="tiny-long"))
  runs = _members(out / "runs.tgz")
  assert "results/tiny-long/runs/table5/new_seed0/reproduce_run.json" in runs
  with tarfile.open(out / "runs.tgz") as tar:
    log = next(tar.extractfile(m).read().decode() for m in tar.getmembers()
               if m.name.endswith("job1.log"))
  assert ("args: -m reproduce table5 new --scale=tiny --variant=long"
          in log)
  assert _members(out / "workdirs.tgz") == {
      "workdirs/reproduce/tiny-long/table5/stopped_seed0/state"}


def test_jobs_an_earlier_call_left_running_are_stopped_first(tmp_path):
  # The device tool ends a killed call's processes, but not its jobs (each
  # leads its own session): the next call on that machine stops them
  # before its own jobs resume the workdirs they hold.
  left = subprocess.Popen(["bash", "-c", "sleep 60; : python -m reproduce t"],
                          start_new_session=True)
  # a pid the list names, taken since by another program: left alone
  other = subprocess.Popen(["bash", "-c", "sleep 60; : other"],
                           start_new_session=True)
  try:
    pids = tmp_path / "workdirs/reproduce/lease_jobs.pids"
    pids.parent.mkdir(parents=True)
    pids.write_text(f"{left.pid}\n{other.pid}\n")
    # reaped at once, as an orphan on the machine is (not a zombie the
    # script would wait 5 s on)
    reaper = threading.Thread(target=left.wait, daemon=True)
    reaper.start()
    _, log = _call(tmp_path, "--help", PY=sys.executable)
    reaper.join(timeout=10)
    assert left.poll() is not None
    assert (f"stopping the jobs an earlier call left running: {left.pid}\n"
            in log)
    assert other.poll() is None
    assert not pids.exists()   # this call's own jobs ended
  finally:
    for p in (left, other):
      if p.poll() is None:
        os.killpg(p.pid, 9)
