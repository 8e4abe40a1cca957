"""Each class of fault at the entry points goes through one mechanism:

* a system error on a path: :mod:`fkjax.oserrors` (one line naming the
  path and the flag; output folders checked before any work);
* environment variables: :mod:`fkjax.environment` (every one fkjax reads,
  checked at the start, in one line naming it);
* Ctrl-C: :mod:`fkjax.interrupt` (one line, exit 130, even where the
  interpreter swallows the ``KeyboardInterrupt``).

Real processes where what a user sees is the point; the mechanisms' pieces
in this process.
"""
import errno
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from fkjax import environment
from fkjax import oserrors
from fkjax.slim import destination

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("fkjax", "reproduce", "benchmarks")


def _sigint_default():
  """In the child, before exec: SIGINT as a terminal gives it (a test run
  started with ``nohup`` or ``&`` would leave it ignored), and held back
  until the entry point takes it over (``fkjax.interrupt.install``
  unblocks it), so that a Ctrl-C sent while the interpreter starts is
  handled, not lost."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _env(**extra):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("FKJAX_") or k == "FKJAX_DATA_DIR"}
  env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **extra)
  return env


def _run(args, cwd=REPO, **env):
  return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(**env),
                        capture_output=True, text=True,
                        preexec_fn=_sigint_default)


def _one_line(proc, code):
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == code, proc.stderr
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  return lines[0]


def _unwritable(tmp_path):
  """A folder this process cannot create files in."""
  if os.geteuid() == 0:   # root ignores permissions; sysfs refuses creation
    if not os.path.isdir("/sys/kernel"):
      pytest.skip("no folder that root cannot write")
    return pathlib.Path("/sys/kernel")
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o500)
  return locked


# --------------------------------------------------------------------------
# --help


@pytest.mark.parametrize("tool", ["train.py", "eval.py", "export.py"])
def test_help_exits_0(tool):
  proc = _run([tool, "--help"])
  assert proc.returncode == 0, proc.stderr
  assert "--workdir" in proc.stdout + proc.stderr


# --------------------------------------------------------------------------
# Paths


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOTDIR,
                                  errno.ENOSPC, errno.EFBIG, errno.EXDEV,
                                  errno.EDQUOT, errno.EPERM])
def test_an_os_error_names_the_flag_and_the_file(code):
  e = OSError(code, os.strerror(code), "/data/results/cpu/table1.json")
  line = oserrors.describe(e, {"--root": "/data/runs",
                               "--results": "/data/results"})
  assert line.startswith("--results=/data/results: ")
  assert "/data/results/cpu/table1.json" in line
  assert "\n" not in line


def test_the_deepest_flag_is_named():
  e = OSError(errno.EROFS, "x", "/a/b/c/file")
  assert oserrors.describe(e, {"--root": "/a", "--out": "/a/b/c"}).startswith(
      "--out=/a/b/c: ")


def test_an_os_error_behind_another_is_found():
  try:
    try:
      raise OSError(errno.EXDEV, "Invalid cross-device link", "/x", "/y")
    except OSError as e:
      raise ValueError("wrapped") from e
  except ValueError as outer:
    assert oserrors.os_error(outer).errno == errno.EXDEV


def test_an_empty_path_is_refused():
  with pytest.raises(oserrors.PathError, match="--workdir is empty"):
    oserrors.check_writable("--workdir", "")


def test_a_file_on_the_way_is_refused(tmp_path):
  (tmp_path / "f").write_text("kept")
  with pytest.raises(oserrors.PathError,
                     match=f"--out={tmp_path}/f/x lies below {tmp_path}/f"):
    oserrors.check_writable("--out", str(tmp_path / "f" / "x"))
  with pytest.raises(oserrors.PathError, match="checkpoints is a file"):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "checkpoints").write_text("")
    oserrors.check_writable("--workdir", str(tmp_path / "w"),
                            folders=("checkpoints",))
  assert (tmp_path / "f").read_text() == "kept"


def test_an_unwritable_folder_is_refused_and_nothing_is_left(tmp_path):
  locked = _unwritable(tmp_path)
  before = sorted(os.listdir(locked))
  with pytest.raises(oserrors.PathError) as info:
    oserrors.check_writable("--results", str(locked / "new" / "results"))
  assert str(info.value).startswith(f"--results={locked}/new/results: ")
  writable = tmp_path / "ok" / "deeper"
  oserrors.check_writable("--results", str(writable))
  assert sorted(os.listdir(locked)) == before
  assert not (tmp_path / "ok").exists()   # probed, nothing made


def test_train_with_an_empty_workdir_is_one_line(tmp_path):
  proc = _run([str(REPO / "train.py"),
               f"--config={REPO / 'configs' / 'tiny.py'}", "--workdir="],
              cwd=tmp_path)
  assert "--workdir" in _one_line(proc, 1)
  assert not list(tmp_path.iterdir())   # no fkjax.lock left here


def test_train_whose_checkpoints_is_a_file_stops_before_training(tmp_path):
  (tmp_path / "checkpoints").write_text("")
  proc = _run(["train.py", "--config=configs/tiny.py",
               f"--workdir={tmp_path}"])
  line = _one_line(proc, 1)
  assert f"--workdir={tmp_path}" in line and "checkpoints" in line
  assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]
  assert not proc.stdout   # nothing trained


def test_reproduce_checks_its_results_folder_before_training(tmp_path,
                                                             capsys):
  from reproduce import __main__ as reproduce_main  # pylint: disable=C0415
  locked = _unwritable(tmp_path)
  argv = ["table1", "--scale=tiny", "--rows=resnet20_none", "--seeds=1",
          f"--root={tmp_path / 'w'}", f"--results={locked / 'results'}"]
  old_argv, sys.argv = sys.argv, ["reproduce", *argv]
  try:
    code = reproduce_main._run_cli()  # pylint: disable=protected-access
  finally:
    sys.argv = old_argv
  err = capsys.readouterr().err
  assert code == 1, err
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith(
      f"error: --results={locked / 'results'}: "), err
  assert not (tmp_path / "w").exists()   # no run started


def test_an_export_is_staged_inside_its_destination(tmp_path):
  out = tmp_path / "slim"
  staged = destination.staging(str(out))
  # Inside: the same file system as out, wherever out is mounted.
  assert pathlib.Path(staged).parent == out
  destination.check(str(out))   # a folder being written is no one's file
  destination.discard(staged)
  assert not out.exists()       # made for the export, removed with it
  (tmp_path / "kept").mkdir()
  (tmp_path / "kept" / "notes.txt").write_text("mine")
  staged = destination.staging(str(tmp_path / "kept"))
  destination.discard(staged)
  assert os.listdir(tmp_path / "kept") == ["notes.txt"]


def test_a_killed_exports_staging_folder_is_removed(tmp_path):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  left = tmp_path / f"{destination.STAGING_PREFIX}{dead.stdout.strip()}-x"
  left.mkdir(parents=True)
  destination.discard(destination.staging(str(tmp_path)))
  assert not left.exists()


# --------------------------------------------------------------------------
# Environment variables


def _fkjax_variables_in_sources():
  found = set()
  for package in SOURCES:
    for path in (REPO / package).rglob("*.py"):
      found.update(re.findall(r"\bFKJAX_[A-Z0-9_]+\b", path.read_text()))
  for path in REPO.glob("*.py"):
    found.update(re.findall(r"\bFKJAX_[A-Z0-9_]+\b", path.read_text()))
  return found


def test_every_variable_fkjax_names_is_declared():
  declared = {v.name for v in environment.VARIABLES}
  assert _fkjax_variables_in_sources() <= declared


def test_the_docs_list_exactly_the_declared_variables():
  # docs/training.md's table, generated from fkjax.environment.VARIABLES:
  # each variable once, in order, with its declared meaning.
  docs = (REPO / "docs" / "training.md").read_text()
  rows = re.findall(r"^\| `(FKJAX_\w+)` \| ([^|]+) \|", docs, re.M)
  assert rows == [(v.name, v.meaning) for v in environment.VARIABLES]
  # Its exit statuses are the code's.
  from fkjax import interrupt
  section = docs.split("## Exit status", 1)[1].split("\n## ", 1)[0]
  statuses = re.findall(r"^\| (\d+) \|", section, re.M)
  assert statuses == ["0", "1", "2", str(interrupt.EXIT_CODE)]


def test_nothing_reads_the_environment_around_the_declaration():
  # Every FKJAX_ variable is read through fkjax.environment (one meaning
  # of a value everywhere): no os.environ.get / getenv of one elsewhere.
  pattern = re.compile(r"(environ\.get\(|getenv\()\s*"
                       r"(\"FKJAX_|'FKJAX_|[A-Z_]*_ENV\b)")
  offenders = [str(p.relative_to(REPO))
               for package in SOURCES for p in (REPO / package).rglob("*.py")
               if p.name != "environment.py" and pattern.search(p.read_text())]
  assert offenders == []


@pytest.mark.parametrize("value, on", [("1", True), ("true", True),
                                       ("yes", True), ("0", False),
                                       ("false", False), ("", False)])
def test_a_switch_means_the_same_everywhere(monkeypatch, value, on):
  monkeypatch.setenv("FKJAX_TRACEBACK", value)
  environment.check()
  assert environment.enabled("FKJAX_TRACEBACK") is on


BAD_VALUES = {
    "FKJAX_TRACEBACK": "maybe",
    "FKJAX_ALLOW_UNVERIFIED_CHECKPOINT": "perhaps",
    "FKJAX_NO_XLA_FLAGS": "2",
    "FKJAX_KERNELS_PLATFORM": "nonsense",
    "FKJAX_DATA_DIR": "{file}",
    "FKJAX_CIFAR_URL": "cifar.example.org/data",
    "FKJAX_ONEDNN_ROOT": "{missing}",
    "FKJAX_ONEDNN_CACHE": "{file}/cache",
}


def test_every_variable_has_a_wrong_value_case():
  assert set(BAD_VALUES) == {v.name for v in environment.VARIABLES}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_wrong_variable_is_one_line_naming_it(tmp_path, name):
  (tmp_path / "a_file").write_text("")
  value = BAD_VALUES[name].format(file=tmp_path / "a_file",
                                  missing=tmp_path / "missing")
  with pytest.raises(environment.EnvironmentVariableError) as info:
    environment.check({name: value})
  assert str(info.value).startswith(f"environment variable {name}=")


@pytest.mark.parametrize("command", [
    ["train.py", "--config=configs/tiny.py", "--workdir={tmp}"],
    ["eval.py", "--workdir={tmp}"],
    ["export.py", "--workdir={tmp}"],
    ["-m", "reproduce", "list"],
])
def test_each_entry_point_checks_the_environment_first(tmp_path, command):
  proc = _run([a.format(tmp=tmp_path / "w") for a in command],
              FKJAX_KERNELS_PLATFORM="nonsense")
  assert "FKJAX_KERNELS_PLATFORM='nonsense'" in _one_line(proc, 2)
  assert not proc.stdout


def test_a_cpu_only_kernel_for_a_gpu_is_refused_by_the_config_check(
    monkeypatch):
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.config import record  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.kernels.conv = "onednn"
  monkeypatch.setenv("FKJAX_KERNELS_PLATFORM", "gpu")
  with pytest.raises(record.ConfigError,
                     match="config.kernels.conv='onednn'.*FKJAX_KERNELS_"
                     "PLATFORM=gpu"):
    record.validate(config)


def test_an_unknown_sparsifier_is_refused_without_importing_jax():
  proc = _run(["-c", textwrap.dedent("""
      import sys
      from configs import tiny
      from fkjax.config import record
      config = tiny.get_config()
      config.sparsity.method = "rgms"
      try:
        record.validate(config)
      except record.ConfigError as e:
        print(e)
      print("jax" in sys.modules)
  """)])
  assert proc.stdout.splitlines()[-1] == "False", proc.stderr
  assert "config.sparsity.method='rgms'" in proc.stdout


def test_the_sparsifier_names_are_the_registrys():
  from fkjax import sparsity  # pylint: disable=import-outside-toplevel
  from fkjax.config import names  # pylint: disable=import-outside-toplevel
  assert set(names.SPARSITY_METHODS) == set(sparsity.sparsifiers.METHODS)


# --------------------------------------------------------------------------
# Ctrl-C

_SWALLOWED = textwrap.dedent("""
    import gc, os, signal, time
    from fkjax import cli

    def main(argv):
      sent = []
      def collecting(phase, info):
        # Ctrl-C arriving while the garbage collector runs a callback (as
        # JAX's _xla_gc_callback): Python reports "Exception ignored".
        if phase == "start" and not sent:
          sent.append(os.kill(os.getpid(), signal.SIGINT))
          total = 0
          for i in range(10000):
            total += i
      gc.callbacks.append(collecting)
      gc.collect()
      for _ in range(6000):   # a minute of work, unless interrupted
        time.sleep(0.01)
      print("finished")

    cli.run(main)
""")


def test_ctrl_c_swallowed_in_a_callback_still_stops_in_one_line():
  proc = _run(["-c", _SWALLOWED])
  _one_line(proc, 130)
  assert "finished" not in proc.stdout


# Seconds after the start at which Ctrl-C is sent: the imports, flag
# parsing, JAX's start and compilation, the epochs, the saves and the final
# evaluation of a tiny run (on a busy machine each lands elsewhere; every
# moment must end the same way).
DELAYS = (0.0, 0.2, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 11.0, 15.0, 20.0)


def _interrupted(args, delay, cwd=REPO):
  """``args`` run as a process, Ctrl-C sent after ``delay`` seconds."""
  import time  # pylint: disable=import-outside-toplevel
  proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, preexec_fn=_sigint_default)
  time.sleep(delay)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate()
  return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _ended_by_ctrl_c_or_done(proc):
  """Exit 130 and exactly one stderr line (or the run had finished)."""
  if proc.returncode == 0:
    return "done"
  _one_line(proc, 130)
  return "interrupted"


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_a_training_is_one_line(tmp_path):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from tests import test_train  # pylint: disable=import-outside-toplevel
  command = ["train.py", "--config=configs/tiny.py"]
  full = _run([*command, f"--workdir={tmp_path / 'full'}"])
  assert full.returncode == 0, full.stderr
  outcomes = []
  for delay in DELAYS:
    proc = _interrupted([*command, f"--workdir={tmp_path / 'cut'}"], delay)
    outcomes.append(_ended_by_ctrl_c_or_done(proc))
    if outcomes[-1] == "done":
      break
  assert outcomes.count("interrupted") >= 3, outcomes
  resumed = _run([*command, f"--workdir={tmp_path / 'cut'}"])
  assert resumed.returncode == 0, resumed.stderr
  step_a, a = test_train._restore(tmp_path / "full")  # pylint: disable=W0212
  step_b, b = test_train._restore(tmp_path / "cut")  # pylint: disable=W0212
  assert step_a == step_b
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a),
               jax.device_get(b))


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_a_reproduction_is_one_line(tmp_path):
  command = ["-m", "reproduce", "table1", "--scale=tiny",
             "--rows=resnet20_none", "--seeds=1", f"--root={tmp_path / 'w'}",
             f"--results={tmp_path / 'r'}"]
  outcomes = [_ended_by_ctrl_c_or_done(_interrupted(command, delay))
              for delay in DELAYS[:8]]
  assert outcomes.count("interrupted") >= 3, outcomes
  finished = _run(command)
  assert finished.returncode == 0, finished.stderr
  assert (tmp_path / "r" / "tiny" / "table1.json").exists()
