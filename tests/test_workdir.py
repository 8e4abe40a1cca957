"""Workdir lock and results files."""
from __future__ import annotations

import datetime
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_collections
import pytest

import fkjax
from fkjax import workdir as workdir_lib
from fkjax.workdir import lock as workdir_lock

REPO = Path(__file__).resolve().parents[1]

_HOLDER = textwrap.dedent("""
    import sys, time
    from fkjax import workdir
    lock = workdir.WorkdirLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(600)
""")


def test_second_writer_is_refused_until_the_holder_dies(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", _HOLDER, str(tmp_path)], cwd=REPO,
      stdout=subprocess.PIPE, text=True,
      env={**os.environ, "PYTHONPATH": str(REPO)})
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(workdir_lib.WorkdirError) as info:
      workdir_lib.WorkdirLock(tmp_path).acquire()
    message = str(info.value)
    assert message.startswith(
        f"{tmp_path} is in use by process {holder.pid} (-c {tmp_path}) on "
        f"{socket.gethostname()} since ")
    assert message.endswith("; wait for it or stop it")
    since = message.split(" since ")[1].split(";")[0]
    age = (datetime.datetime.now(datetime.timezone.utc)
           - datetime.datetime.fromisoformat(since.replace("Z", "+00:00")))
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=5)
    with pytest.raises(workdir_lib.WorkdirError):  # readers too
      workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # The kernel dropped the dead holder's lock: its note does not block.
  assert (tmp_path / workdir_lib.LOCK_NAME).exists()
  with workdir_lib.WorkdirLock(tmp_path) as lock:
    assert lock.held
  assert not lock.held


def test_lock_in_one_process(tmp_path):
  first = workdir_lib.WorkdirLock(tmp_path / "new").acquire()
  assert (tmp_path / "new").is_dir()
  with pytest.raises(workdir_lib.WorkdirError,
                     match=f"in use by process {os.getpid()} "):
    workdir_lib.WorkdirLock(tmp_path / "new").acquire()
  first.release()
  workdir_lib.WorkdirLock(tmp_path / "new").acquire().release()


def test_shared_holders_coexist_but_exclude_a_writer(tmp_path):
  a = workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()
  b = workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()
  with pytest.raises(workdir_lib.WorkdirError, match="in use by"):
    workdir_lib.WorkdirLock(tmp_path).acquire()
  a.release()
  b.release()
  workdir_lib.WorkdirLock(tmp_path).acquire().release()


def test_a_run_that_wrote_nothing_leaves_nothing_behind(tmp_path):
  # A run that failed before training (bad data, a download error) left
  # fkjax.lock in a directory it had created for nothing.
  new = tmp_path / "a" / "new"
  with pytest.raises(RuntimeError, match="no data"):
    with workdir_lib.WorkdirLock(new):
      raise RuntimeError("no data")
  assert not (tmp_path / "a").exists()
  # An existing, empty workdir stays, without the lock file.
  empty = tmp_path / "empty"
  empty.mkdir()
  workdir_lib.WorkdirLock(empty).acquire().release()
  assert empty.is_dir() and not list(empty.iterdir())
  # A workdir holding a run keeps everything, the lock file too.
  run = tmp_path / "run"
  with workdir_lib.WorkdirLock(run):
    (run / "config.json").write_text("{}")
  assert sorted(p.name for p in run.iterdir()) == [
      "config.json", workdir_lib.LOCK_NAME]
  # A shared holder (an evaluation) keeps the lock file train.py left.
  workdir_lib.WorkdirLock(run, shared=True).acquire().release()
  assert (run / workdir_lib.LOCK_NAME).exists()


def test_an_evaluation_leaves_no_lock_file(tmp_path):
  # eval.py left fkjax.lock in the workdir after it exited.
  (tmp_path / "config.json").write_text("{}")
  workdir_lib.WorkdirLock(tmp_path, shared=True).acquire().release()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
  # Two side by side: the last one out removes it, whichever made it.
  a = workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()
  b = workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()
  a.release()
  assert (tmp_path / workdir_lib.LOCK_NAME).exists()
  with pytest.raises(workdir_lib.WorkdirError, match="in use by"):
    workdir_lib.WorkdirLock(tmp_path).acquire()   # b still excludes a writer
  b.release()
  assert not (tmp_path / workdir_lib.LOCK_NAME).exists()
  # A writer that opened the file before the reader removed it locks the
  # file the path names afterwards, and excludes the next one.
  reader = workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()
  stale = os.open(reader.path, os.O_RDWR)
  reader.release()
  assert not workdir_lock._is_current(stale, reader.path)
  os.close(stale)
  with workdir_lib.WorkdirLock(tmp_path):
    with pytest.raises(workdir_lib.WorkdirError, match="in use by"):
      workdir_lib.WorkdirLock(tmp_path, shared=True).acquire()


def test_a_lock_on_a_file_removed_by_its_releaser_is_not_kept(tmp_path):
  # Process B opened fkjax.lock just before A released and removed it: B's
  # lock on the removed file would exclude nobody, so B locks the new file.
  lock_b = workdir_lib.WorkdirLock(tmp_path / "w")
  a = workdir_lib.WorkdirLock(tmp_path / "w").acquire()
  stale = os.open(a.path, os.O_RDWR)
  a.release()   # removes the file and the directory
  assert not (tmp_path / "w").exists()
  assert not workdir_lock._is_current(stale, a.path)
  os.close(stale)
  lock_b.acquire()
  with pytest.raises(workdir_lib.WorkdirError, match="in use by"):
    workdir_lib.WorkdirLock(tmp_path / "w").acquire()
  lock_b.release()


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_workdir_that_is_a_file_is_one_line(tmp_path, below):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  path = a_file / below if below else a_file
  with pytest.raises(workdir_lib.WorkdirError,
                     match=f"--workdir={path} is not a directory"):
    workdir_lib.WorkdirLock(path).acquire()
  assert a_file.read_text() == ""


def test_result_paths_never_collide(tmp_path):
  names = {
      os.path.basename(workdir_lib.result_path(tmp_path, p, **s))
      for p, s in [("final", {}), ("paper", {}), ("strong", {}),
                   ("paper", {"eot": 10}), ("paper", {"eot": 10, "n": 500}),
                   ("paper", {"checkpoint": "latest"})]}
  assert names == {"final_eval.json", "eval_paper.json", "eval_strong.json",
                   "eval_paper_eot10.json", "eval_paper_eot10_n500.json",
                   "eval_paper_checkpointlatest.json"}
  # Order of settings does not matter; None/False mean "default".
  assert (workdir_lib.result_path(tmp_path, "x", b=1, a="y/z") ==
          workdir_lib.result_path(tmp_path, "x", a="y/z", b=1, c=None,
                                  d=False) ==
          str(tmp_path / "eval_x_ay-z_b1.json"))
  for bad in ("", "a_b", "a/b"):
    with pytest.raises(ValueError, match="protocol"):
      workdir_lib.result_path(tmp_path, bad)


def _eval_config(**eval_settings):
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.eval.update(eval_settings)
  return config


def test_a_subset_evaluation_says_so_in_its_name(tmp_path):
  name = lambda **e: os.path.basename(workdir_lib.eval_result_path(
      tmp_path, _eval_config(**e)))
  assert name() == "eval_paper.json"   # the whole test set
  assert name(num_examples=50) == "eval_paper_n50.json"
  assert name(num_examples=50, eot_samples=4) == "eval_paper_eot4_n50.json"
  assert name(protocol="strong", num_examples=200) == "eval_strong_n200.json"
  # APGD-T is in the strong protocol by default: a run without it says so.
  assert _eval_config().eval.strong.targeted
  untargeted = _eval_config(protocol="strong")
  untargeted.eval.strong.targeted = False
  assert os.path.basename(workdir_lib.eval_result_path(
      tmp_path, untargeted)) == "eval_strong_untargeted.json"
  assert name(protocol="a5", num_examples=100) == "eval_a5_n100.json"


def test_a_subset_result_named_as_the_whole_sets_is_adopted(tmp_path):
  subset = _eval_config(num_examples=50)
  old = tmp_path / "eval_paper.json"
  for recorded, moves in ((0, False), (50, True)):
    # A whole-set result stays; the same subset's, written before subsets
    # said so in their names, takes its name now.
    metadata = workdir_lib.results_metadata(
        _eval_config(num_examples=recorded), step=1, data="d",
        checkpoint="best", protocol="paper")
    workdir_lib.write_results(old, {"num_examples": recorded or 10000},
                              metadata)
    assert workdir_lib.adopt_subset_result(tmp_path, subset) is moves
    assert old.exists() is not moves
  assert json.loads((tmp_path / "eval_paper_n50.json").read_text())[
      "num_examples"] == 50
  # Never over a file, and never for the whole set's config.
  workdir_lib.write_results(old, {"num_examples": 50}, metadata)
  assert not workdir_lib.adopt_subset_result(tmp_path, subset)
  assert not workdir_lib.adopt_subset_result(tmp_path, _eval_config())
  assert old.exists()


def _config():
  config = ml_collections.ConfigDict()
  config.model = {"depth": 20, "width": 16}
  config.eval = {"epsilon": 8 / 255, "eot_samples": 10}
  return config


def test_write_results_records_what_produced_them(tmp_path):
  path = workdir_lib.result_path(tmp_path, "paper", eot=10)
  metadata = workdir_lib.results_metadata(
      _config(), step=1200, data="CIFAR-10 test", checkpoint="best",
      protocol="paper")
  workdir_lib.write_results(path, {"accuracy": 0.5, "loss": float("nan")},
                            metadata)
  written = json.loads(Path(path).read_text())
  assert written["accuracy"] == 0.5
  assert written["loss"] is None  # JSON has no NaN
  meta = written["metadata"]
  assert meta["config"]["eval"]["eot_samples"] == 10
  assert meta["config"]["model"]["depth"] == 20
  assert (meta["step"], meta["checkpoint"], meta["data"], meta["protocol"]) \
      == (1200, "best", "CIFAR-10 test", "paper")
  assert meta["fkjax_version"] == fkjax.__version__
  head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                        capture_output=True, text=True)
  if head.returncode == 0:  # a git checkout (not an sdist)
    assert meta["git_commit"] == head.stdout.strip()
    assert isinstance(meta["git_dirty"], bool)
  date = datetime.datetime.fromisoformat(meta["date"].replace("Z", "+00:00"))
  assert date.tzinfo is not None
  assert [p.name for p in tmp_path.iterdir()] == ["eval_paper_eot10.json"]


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
  path = tmp_path / "final_eval.json"
  workdir_lib.write_results(path, {"accuracy": 0.25}, {"step": 1})
  before = path.read_bytes()

  def full_disk(src, dst):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(os, "replace", full_disk)
  with pytest.raises(workdir_lib.WorkdirError,
                     match=f"no space left on device while writing {path}"):
    workdir_lib.write_results(path, {"accuracy": 0.75}, {"step": 2})
  assert path.read_bytes() == before
  assert [p.name for p in tmp_path.iterdir()] == ["final_eval.json"]
  with pytest.raises(ValueError, match="metadata"):
    workdir_lib.write_results(path, {"metadata": 1}, {})


def test_source_version_outside_a_checkout(tmp_path, monkeypatch):
  monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-repo"))
  info = workdir_lib.source_version()
  assert info == {"fkjax_version": fkjax.__version__, "git_commit": None,
                  "git_dirty": None}


def test_source_version_of_the_package_alone(tmp_path, monkeypatch):
  # A checkout whose results/ were rewritten is not other code; one whose
  # package changed is.
  def git(*args):
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                    "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)
  (tmp_path / "fkjax").mkdir()
  (tmp_path / "results").mkdir()
  (tmp_path / "fkjax" / "__init__.py").write_text("x = 1\n")
  (tmp_path / "results" / "t.json").write_text("{}\n")
  git("init", "-q")
  git("add", ".")
  git("commit", "-q", "-m", "c")
  monkeypatch.delenv("GIT_DIR", raising=False)
  monkeypatch.setattr(fkjax, "__file__",
                      str(tmp_path / "fkjax" / "__init__.py"))
  assert workdir_lib.source_version(package_only=True)["git_dirty"] is False
  (tmp_path / "results" / "t.json").write_text("{\"a\": 1}\n")
  assert workdir_lib.source_version()["git_dirty"] is True
  assert workdir_lib.source_version(package_only=True)["git_dirty"] is False
  (tmp_path / "fkjax" / "__init__.py").write_text("x = 2\n")
  info = workdir_lib.source_version(package_only=True)
  assert info["git_dirty"] is True and len(info["git_commit"]) == 40
