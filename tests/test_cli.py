"""train.py, eval.py and ``python -m reproduce`` end a user's mistake
in one line, before any work.

Each case is a real process: what a user sees is its stderr and exit code;
``python -m reproduce``'s many cases run its main in this process, and one
of them also as a process.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_env import FILE_SIZE_LIMIT
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]


def _run(args, env=None, timeout=TIMEOUT_S):
  full_env = dict(os.environ)
  full_env.pop("FKJAX_TRACEBACK", None)
  full_env.update(env or {})
  return subprocess.run([sys.executable, *args], cwd=REPO, env=full_env,
                        capture_output=True, text=True, timeout=timeout)


def _assert_one_line_error(proc, *fragments, code=None):
  assert proc.returncode != 0, proc.stdout
  if code is not None:
    assert proc.returncode == code, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  errors = [l for l in lines if l.startswith("error: ")]
  assert len(errors) == 1, proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr
  for fragment in fragments:
    assert fragment in errors[0], errors[0]


@pytest.mark.parametrize("args,fragments,code", [
    (["--config=configs/tiny.py:resnet21x"],
     ["unknown config preset 'resnet21x'"], 2),
    (["--config=configs/tiny.py", "--config.sparsity.lambda=1"],
     ["--config.sparsity.lambda: config.sparsity has no field 'lambda'; "
      "did you mean config.sparsity.lamb?"], 2),
    (["--config=configs/tiny.py", "--config.sparsity.lamb_one=1"],
     ["--config.sparsity.lamb_one", "config.sparsity has no field 'lamb_one'",
      "its fields: admm_variant, beta,"], 2),
    (["--config=configs/tiny.py:rgsm", "--config.modl.depth=8"],
     ["config has no field 'modl'; did you mean config.model?"], 2),
    (["--config=configs/tiny.py", "--config.model.skip=maybe"],
     ["--config.model.skip=maybe: 'maybe' is not a boolean (true or false)"],
     2),
    (["--config=configs/tiny.py", "--config.model.depth.x=1"],
     ["--config.model.depth.x", "config.model.depth is a value (int)"], 2),
    (["--config=configs/sweep.py:tiny", "--config.sweep.runs=2"],
     ["config.sweep has no field 'runs'", "product"], 2),
    (["--config=configs/nope.py"], ["nope.py"], 2),
    (["--config=configs/tiny.py", "--config.model.depth=21"],
     ["config.model.depth=21", "6n+2"], 1),
    (["--config=configs/tiny.py", "--config.attack.epsilon=8.0"],
     ["config.attack.epsilon=8.0", "8/255"], 1),
    (["--config=configs/tiny.py", "--config.training.num_epochs=0"],
     ["config.training.num_epochs=0"], 1),
    (["--config=configs/tiny.py", "--config.sparsity.beta=0.0"],
     ["config.sparsity", "beta=0.0", "out of range"], 1),
    (["--config=configs/tiny.py", "--config.eval.final_attacks=natural,pgd"],
     ["unknown attack"], 1),
    (["--config=configs/tiny.py", "stray"], ["unexpected arguments"], 2),
    (["--config=configs/tiny.py", "--config.dataset.synthetic_sizes=(-5,32)"],
     ["config.dataset.synthetic_sizes=(-5, 32)", "two integers >= 1"], 1),
    (["--config=configs/tiny.py", "--config.seed=-1"],
     ["config.seed=-1", "an integer >= 0"], 1),
    (["--config=configs/tiny.py", "--config.dataset.val_size=96"],
     ["config.dataset.val_size=96", "96 training images",
      "config.dataset.synthetic_sizes[0]"], 1),
    (["--config=configs/cpu.py", "--config.dataset.val_size=50000"],
     ["config.dataset.val_size=50000", "official cifar10 training set"], 1),
    (["--config=configs/tiny.py", "--config.num_devices=99"],
     ["config.num_devices=99", "visible", "use at most"], 1),
    (["--config=configs/tiny.py", "--config.eval.nattack_chunk=-3"],
     ["config.eval.nattack_chunk=-3", "an integer >= 0"], 1),
    # A ValueError's traceback, after the data were read.
    (["--config=configs/tiny.py", "--config.training.batch_size=65"],
     ["config.training.batch_size=65", "exceeds the 64 training examples",
      "choose at most 64"], 1),
    # max() of no attacks, at the end of the evaluation.
    (["--config=configs/tiny.py", "--config.eval.attacks="],
     ["config.eval.attacks=''", "at least one attack"], 1),
])
def test_train_rejects_bad_input_in_one_line(tmp_path, args, fragments, code):
  workdir = tmp_path / "run"
  proc = _run(["train.py", f"--workdir={workdir}", *args])
  _assert_one_line_error(proc, *fragments, code=code)
  # Nothing was recorded: the corrected command starts cleanly.
  assert not (workdir / "config.json").exists()
  assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize("args,fragments", [
    (["--config.training.batch_size=20"],
     ["config.training.batch_size=20", "8 devices", "multiple of 8"]),
    # 68 training images: the last batch of 4 cannot split.
    (["--config.dataset.synthetic_sizes=(100,32)"],
     ["last training batch (4 of 68 images)", "8 devices",
      "config.training.drop_last=True"]),
])
def test_a_training_batch_that_cannot_split_is_refused_before_any_step(
    tmp_path, args, fragments):
  """On 8 devices, naming the setting; evaluation batches are padded
  instead (tests/test_any_device_count.py)."""
  workdir = tmp_path / "run"
  proc = _run(["train.py", "--config=configs/tiny.py",
               f"--workdir={workdir}", *args],
              env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  _assert_one_line_error(proc, *fragments, code=1)
  assert not (workdir / "checkpoints").exists()


def test_a_workdir_that_is_a_file_is_one_line(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("kept")
  proc = _run(["train.py", "--config=configs/tiny.py",
               f"--workdir={a_file}"])
  _assert_one_line_error(proc, f"--workdir={a_file} is not a directory",
                         code=1)
  assert a_file.read_text() == "kept"


def test_a_user_error_is_named_without_importing_jax():
  # Importing every error's module (fkjax.checkpoint: JAX and orbax) cost
  # seconds before each one-line error.
  proc = _run(["-c", "import sys; from fkjax import cli; from fkjax.config import record as run_config; "
               "e = run_config.ConfigError('x'); "
               "print(cli.is_user_error(e), cli.is_user_error(ValueError()), "
               "'jax' in sys.modules)"])
  assert proc.stdout.split() == ["True", "False", "False"], proc.stderr


def test_missing_workdir_flag_is_one_line():
  proc = _run(["train.py", "--config=configs/tiny.py"])
  _assert_one_line_error(proc, "--workdir", code=2)


def test_traceback_flag_shows_the_traceback(tmp_path):
  args = ["train.py", f"--workdir={tmp_path}", "--config=configs/tiny.py",
          "--config.model.depth=21"]
  assert "Traceback" in _run([*args, "--traceback"]).stderr
  assert "Traceback" in _run(args, env={"FKJAX_TRACEBACK": "1"}).stderr


def test_eval_of_a_missing_workdir_fails_at_once(tmp_path):
  proc = _run(["eval.py", f"--workdir={tmp_path / 'nowhere'}"])
  _assert_one_line_error(proc, "no config.json", "nowhere")


@pytest.mark.parametrize("flag, fragment", [
    ("--check_examples=-5", "--check_examples=-5"),
    (None, "no config.json"),
    ("--config.eval.atacks=natural", "did you mean config.eval.attacks?"),
])
def test_export_rejects_bad_input_in_one_line(tmp_path, flag, fragment):
  # A negative count sliced the test set from its end: 9,995 images checked.
  proc = _run(["export.py", f"--workdir={tmp_path / 'nowhere'}",
               *([flag] if flag else [])])
  _assert_one_line_error(proc, fragment)


def test_eval_names_an_overrides_unknown_field_in_one_line(tmp_path):
  # eval.py's default config file is loaded, overrides applied, as its flag
  # is defined, before the command line is parsed.
  proc = _run(["eval.py", f"--workdir={tmp_path}",
               "--config.eval.atacks=natural"])
  _assert_one_line_error(
      proc, "--config.eval.atacks: config.eval has no field 'atacks'; "
      "did you mean config.eval.attacks?", code=2)
  assert "Traceback" in _run(["eval.py", f"--workdir={tmp_path}",
                              "--config.eval.atacks=natural",
                              "--traceback"]).stderr


def test_eval_refuses_an_override_that_changes_the_run(tmp_path):
  sys.path.insert(0, str(REPO))
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  run_config.save(tiny.get_config(), str(tmp_path))
  proc = _run(["eval.py", f"--workdir={tmp_path}",
               "--config.sparsity.lamb=0.1"])
  _assert_one_line_error(proc, "--config.sparsity.lamb=0.1",
                         "would change what the run")
  proc = _run(["eval.py", f"--workdir={tmp_path}",
               "--config=configs/tiny.py:rgsm"])
  _assert_one_line_error(proc, "sparsity.method")
  # An allowed override gets as far as the (missing) checkpoints.
  proc = _run(["eval.py", f"--workdir={tmp_path}",
               "--config.eval.attacks=natural"])
  _assert_one_line_error(proc, "no checkpoints")
  assert json.loads((tmp_path / "config.json").read_text())["model"][
      "depth"] == 8
  # A run kept without checkpoints (results/<scale>/runs/...) stays as it
  # was: nothing written into it, not even eval's lock file.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_eval_refuses_an_override_before_importing_jax(tmp_path):
  # The refusal needs the run's config and the override alone; importing
  # JAX first cost ~2 s before the line.
  sys.path.insert(0, str(REPO))
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  run_config.save(tiny.get_config(), str(tmp_path))
  proc = _run(["-X", "importtime", "eval.py", f"--workdir={tmp_path}",
               "--config.sparsity.lamb=0.1"])
  assert proc.returncode == 1
  assert "would change what the run" in proc.stderr.splitlines()[-1]
  imported = [l.rsplit("|", 1)[-1].strip() for l in proc.stderr.splitlines()
              if l.startswith("import time:")]
  assert "fkjax.config.record" in imported and "jax" not in imported


@pytest.mark.parametrize("chunk", ["-1", "-3"])
def test_eval_refuses_negative_nattack_chunks(tmp_path, chunk):
  # A negative chunk failed inside JAX (0: as the device's memory holds).
  sys.path.insert(0, str(REPO))
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  run_config.save(tiny.get_config(), str(tmp_path))
  proc = _run(["eval.py", f"--workdir={tmp_path}",
               f"--config.eval.nattack_chunk={chunk}"])
  _assert_one_line_error(proc, f"config.eval.nattack_chunk={chunk} is "
                         "invalid: an integer >= 0", code=1)


def test_a_batch_larger_than_a_subset_is_one_line(tmp_path):
  # Only the data say how many images 2 a class leaves (20): said once read.
  workdir = tmp_path / "run"
  proc = _run(["train.py", f"--workdir={workdir}", "--config=configs/tiny.py",
               "--config.dataset.subset_per_class=2",
               "--config.training.batch_size=32"])
  _assert_one_line_error(proc, "config.training.batch_size=32 exceeds the 20 "
                         "training examples", "at most 20", code=1)


def test_eval_refuses_no_attacks_in_one_line(tmp_path):
  sys.path.insert(0, str(REPO))
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  run_config.save(tiny.get_config(), str(tmp_path))
  proc = _run(["eval.py", f"--workdir={tmp_path}", "--config.eval.attacks="])
  _assert_one_line_error(proc, "config.eval.attacks=''", "at least one attack",
                         code=1)


@pytest.mark.parametrize("download", ["false", "true"])
def test_missing_data_is_one_line(tmp_path, download):
  # download=true: the download fails (its URL names no file).
  proc = _run(["train.py", f"--workdir={tmp_path / 'run'}",
               "--config=configs/cpu.py",
               f"--config.dataset.data_dir={tmp_path / 'empty'}",
               f"--config.dataset.download={download}"],
              env={"FKJAX_CIFAR_URL": f"file://{tmp_path / 'no_mirror'}/"})
  _assert_one_line_error(proc, str(tmp_path / "empty"))
  if download == "true":
    assert "cannot download" in proc.stderr
  # Nothing left behind: not even the lock file, nor the new workdir.
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_is_one_line(tmp_path):
  # Files above 64 KiB fail (EFBIG), as they do on a full disk (ENOSPC):
  # tensorstore's "Event loop is closed" reports came around the line.
  workdir = tmp_path / "run"
  proc = _run(["-c", FILE_SIZE_LIMIT, "train.py", f"--workdir={workdir}",
               "--config=configs/tiny.py", "--config.num_devices=1",
               "--config.compilation_cache_dir="])
  _assert_one_line_error(proc, ": File too large", code=1)
  assert len([l for l in proc.stderr.splitlines() if l.strip()]) == 1, (
      proc.stderr)
  # How orbax splits a checkpoint into files varies from save to save: now
  # and then the first epoch's files all stay under the limit (that save
  # commits), and a later epoch's save is the one that fails.
  step = re.search(r"could not write checkpoint step (\d+) to (\S+): File",
                   proc.stderr)
  assert step, proc.stderr
  assert int(step[1]) in (4, 8, 12), proc.stderr
  assert step[2] == str(workdir / "checkpoints" / step[1]), proc.stderr


def _reproduce_in_process(argv, capsys):
  """``python -m reproduce ARGV``'s main in this process (a real process
  costs seconds of imports a case): its exit code, stdout and stderr."""
  from reproduce import __main__ as reproduce_main  # pylint: disable=C0415
  capsys.readouterr()
  try:
    code = reproduce_main.main(argv)
  except SystemExit as e:   # argparse's errors
    code = e.code
  out = capsys.readouterr()
  return subprocess.CompletedProcess(argv, code, out.out, out.err)


@pytest.mark.parametrize("args,fragments", [
    (["table1", "--rows=nope", "--dry-run"],
     ["table1 has no row 'nope'", "resnet20_none"]),
    (["tableX"], ["unknown table 'tableX'"]),
    (["all", "--rows=resnet20_none,nope", "--dry-run"],
     ["no table has a row 'nope'"]),
    (["table1", "--seeds=0", "--dry-run"], ["--seeds must be >= 1"]),
    (["table1", "--sweep", "--sweep-max-runs=0", "--dry-run"],
     ["--sweep-max-runs must be >= 1"]),
    (["table1", "--scale=tiny", "--root={file}"], ["--root=", "is a file"]),
    (["table1", "--report-only", "--results={file}"],
     ["--results=", "is a file"]),
    (["table1", "--scale=paper", "--variant=long", "--dry-run"],
     ["variant 'long' exists for the cpu scale only, not 'paper'"]),
])
def test_reproduce_rejects_bad_input_in_one_line(tmp_path, args, fragments,
                                                 capsys):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  args = [a.format(file=a_file) for a in args]
  # The case's own --root/--results come last: argparse keeps the last.
  proc = _reproduce_in_process([f"--root={tmp_path / 'w'}",
                                f"--results={tmp_path / 'r'}", *args], capsys)
  _assert_one_line_error(proc, *fragments, code=2)
  assert not proc.stdout, "nothing planned or run before the error"
  assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


def test_reproduce_interrupted_is_one_line(monkeypatch, capsys):
  # Ctrl-C anywhere in a reproduction (a run training, an evaluation): as
  # train.py and eval.py say it.
  from reproduce import __main__ as reproduce_main  # pylint: disable=C0415

  def interrupted():
    raise KeyboardInterrupt
  monkeypatch.setattr(reproduce_main, "main", interrupted)
  code = reproduce_main._run_cli()  # pylint: disable=protected-access
  out = capsys.readouterr()
  _assert_one_line_error(
      subprocess.CompletedProcess([], code, out.out, out.err),
      "interrupted; rerun the same command", code=130)


def test_reproduce_as_a_process_says_the_same_one_line(tmp_path):
  proc = _run(["-m", "reproduce", "tableX", f"--root={tmp_path / 'w'}",
               f"--results={tmp_path / 'r'}"])
  _assert_one_line_error(proc, "unknown table 'tableX'", code=2)
  assert not proc.stdout


def test_reproduce_claims_without_tables_writes_nothing(tmp_path, capsys):
  proc = _reproduce_in_process(["claims", "--scale=paper",
                                f"--results={tmp_path}"], capsys)
  _assert_one_line_error(proc, f"no result tables in {tmp_path}/paper", code=2)
  assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_reproduce_stops_a_table_whose_data_is_missing_in_one_line(tmp_path):
  not_data = tmp_path / "not_data"
  not_data.write_text("")
  proc = _run(["-m", "reproduce", "table5", "--scale=cpu", "--seeds=1",
               "--rows=resnet20_skip,resnet20_noskip",
               f"--data_dir={not_data}", f"--root={tmp_path / 'w'}",
               f"--results={tmp_path / 'r'}"])
  assert proc.returncode == 1
  out = proc.stdout + proc.stderr
  assert "Traceback" not in out, out
  failed = [l for l in out.splitlines() if "FAILED" in l]
  assert len(failed) == 1 and "DataError" in failed[0], out
  assert str(not_data) in failed[0]
  assert "1 other run(s) to run read the same data: not started" in out
  assert "1 run(s) failed, 1 not started" in out
  # The failure is kept for the table, the run not started is not touched.
  assert not (tmp_path / "w" / "cpu" / "table5").exists()
  progress = json.loads(next((tmp_path / "w").rglob("reproduce_progress.json"))
                        .read_text())
  assert progress["error"].startswith("DataError")
  proc = _run(["-m", "reproduce", "table5", "--scale=cpu", "--seeds=1",
               "--rows=resnet20_skip", f"--data_dir={not_data}",
               f"--root={tmp_path / 'w'}", f"--results={tmp_path / 'r'}"],
              env={"FKJAX_TRACEBACK": "1"})
  assert "Traceback" in proc.stderr


@pytest.mark.slow
def test_analysis_of_a_wrong_workdir_is_one_line(tmp_path):
  proc = _run(["-m", "reproduce.analysis",
               f"--workdir={tmp_path / 'nowhere'}"])
  _assert_one_line_error(proc, "no config.json", "nowhere", code=1)
  # A run kept without its checkpoints (results/<scale>/runs/...)
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "config.json").write_text(
      _run(["-c", "from configs import tiny; print(tiny.get_config()"
                  ".to_json())"]).stdout)
  proc = _run(["-m", "reproduce.analysis", f"--workdir={kept}"])
  _assert_one_line_error(proc, "no checkpoints", str(kept), code=1)
