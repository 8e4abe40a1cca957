"""The queue a lent GPU advances: lease, carry-over, unpack, published weights.

The end-to-end tests play a session's calls on the CPU with tiny queues: a
lease stopped mid-run, its output unpacked "at home", a second lease in a
fresh clone of home's results, unpacked again; the numbers and weights must
equal those of a lease never stopped. The first queue is one run; the second
a one-run unit then a 2-seed sweep unit, the first lease stopped mid-sweep.
"""
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from fkjax import pretrained
from fkjax.checkpoint import weights_file

from reproduce import __main__ as reproduce_main
from reproduce import carry
from reproduce import datapack
from reproduce import lease
from reproduce import ledger
from reproduce import queue as queue_lib
from reproduce import runner
from reproduce import scales
from reproduce import tables
from reproduce import weights

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_reproduce.sh"
ENTRY = queue_lib.Entry("tiny", "table1", "resnet20_none", 0)
RUN = Path("results/tiny/runs/table1/resnet20_none_seed0")
CARRIED = Path("results/tiny/carry/table1/resnet20_none_seed0.tar.xz")
WORKDIR = Path("workdirs/reproduce/tiny/table1/resnet20_none_seed0")


# --------------------------------------------------------------------------
# The committed queue (no training).


def test_the_committed_queue_is_the_issues_order():
  entries = queue_lib.load(str(REPO / "results" / queue_lib.QUEUE_FILE))
  assert entries == queue_lib.default_entries()
  # the paper scale's headline first, interleaved with the gpu scale's rows
  assert [e.name for e in entries if e.scale == "paper"] == [
      "paper/table2/resnet20_rgsm_l0.1/seed0",
      "paper/table2/en5resnet20_rgsm_l0.02/seed0",
      "paper/table1/resnet20_none/seed0",
      "paper/table1/en2resnet20_none/seed0"]
  units = queue_lib.units(entries)
  assert [u.scale for u in units[:8]] == ["paper", "gpu"] * 4
  assert (units[1].table, units[1].row, units[1].seeds) == (
      "table1", "resnet20_none", (0, 1, 2))
  # every queued run is planned by the runner, once
  names = [e.name for e in entries]
  assert len(names) == len(set(names))
  gpu_tables = {e.table for e in entries if e.scale == "gpu"}
  assert gpu_tables == {"table1", "table2", "table3", "fig45", "table4",
                        "table5", "table6"}
  for unit in units:
    runs = runner.plan(tables.TABLES[unit.table], scales.SCALES[unit.scale],
                       root="w", rows=[unit.row], seeds=max(unit.seeds) + 1)
    assert [r.seed for r in runs] == list(range(max(unit.seeds) + 1))


def test_the_committed_run_names_are_the_tables():
  # fkjax.pretrained resolves names with this file, not with the tables:
  # `python -m reproduce queue` rewrites it after a table changes.
  committed = json.loads((REPO / "results" / weights_file.NAMES_FILE)
                         .read_text())
  assert committed == weights.names()
  assert committed["table5"]["resnet20_skip"] == "table1/resnet20_none"
  assert committed["table1"]["resnet20_none"] == "table1/resnet20_none"


def test_a_name_resolves_through_the_names_file_or_as_written(tmp_path):
  assert pretrained.run_dir("gpu/table5/resnet20_skip/seed1",
                            str(tmp_path)) == str(
      tmp_path / "gpu/runs/table5/resnet20_skip_seed1")
  weights.write_names(str(tmp_path))
  assert pretrained.run_dir("gpu/table5/resnet20_skip/seed1",
                            str(tmp_path)) == str(
      tmp_path / "gpu/runs/table1/resnet20_none_seed1")
  with pytest.raises(pretrained.PretrainedError, match="no table 'table9'"):
    pretrained.run_dir("gpu/table9/resnet20_skip/seed1", str(tmp_path))


@pytest.mark.parametrize("runs, message", [
    ([{"scale": "gpu", "table": "table2", "row": "resnet20_none",
       "seed": 0}], "trained by table1/resnet20_none"),
    ([{"scale": "gpu", "table": "table9", "row": "x", "seed": 0}],
     "no table 'table9'"),
    ([{"scale": "huge", "table": "table1", "row": "resnet20_none",
       "seed": 0}], "no scale 'huge'"),
    ([{"scale": "gpu", "table": "table1", "row": "resnet20_none",
       "seed": 0}] * 2, "listed twice"),
    ([{"scale": "gpu", "table": "table1"}], "a queue is"),
])
def test_a_bad_queue_is_one_clear_error(tmp_path, runs, message, capsys):
  path = tmp_path / "queue.json"
  path.write_text(json.dumps({"runs": runs}))
  with pytest.raises(queue_lib.QueueError, match=message):
    queue_lib.load(str(path))
  # `python -m reproduce queue`'s main, in this process (the session below
  # runs the module itself)
  assert reproduce_main.main(["queue", f"--queue={path}",
                              f"--results={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and message in err


def test_units_merge_a_rows_consecutive_seeds():
  e = [queue_lib.Entry("gpu", "table1", "resnet20_none", s) for s in (0, 1)]
  e.append(queue_lib.Entry("paper", "table1", "resnet20_none", 0))
  e.append(queue_lib.Entry("gpu", "table1", "resnet20_none", 2))
  units = queue_lib.units(e)
  assert [u.seeds for u in units] == [(0, 1), (0,), (2,)]
  assert units[0].runner_args() == [
      "table1", "--scale=gpu", "--rows=resnet20_none", "--seeds=2",
      "--sweep"]


def test_lease_jobs_deal_the_next_units_round_robin(tmp_path):
  entries = queue_lib.default_entries()
  jobs = lease.prepare(entries, str(tmp_path / "results"),
                       str(tmp_path / "w"), jobs=2, units_per_job=2)
  assert [[u.scale for u in job] for job in jobs] == [["paper", "paper"],
                                                      ["gpu", "gpu"]]


# --------------------------------------------------------------------------
# Data for the lent machine.


def _release(folder, images=7):
  rng = np.random.default_rng(0)
  out = folder / datapack.FOLDER
  out.mkdir(parents=True)
  for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + [
      "test_batch.bin"]:
    (out / name).write_bytes(rng.integers(
        0, 256, (images, datapack.RECORD), dtype=np.uint8).tobytes())
  (out / "batches.meta.txt").write_text("airplane\nautomobile\n")
  return out


def test_the_data_pack_is_lossless_and_waits_for_every_part(tmp_path):
  source = _release(tmp_path / "data")
  manifest = datapack.pack(str(tmp_path / "data"), str(tmp_path / "parts"),
                           part_bytes=20_000)
  assert len(manifest["parts"]) >= 2
  stage = tmp_path / "stage"
  stage.mkdir()
  shutil.copy(tmp_path / "parts" / datapack.MANIFEST, stage)
  shutil.copy(tmp_path / "parts" / manifest["parts"][0]["name"], stage)
  with pytest.raises(ValueError, match=f"1 of {len(manifest['parts'])}"):
    datapack.unpack(str(stage), str(tmp_path / "dest"))
  for part in manifest["parts"]:
    shutil.copy(tmp_path / "parts" / part["name"], stage)
  folder = Path(datapack.unpack(str(stage), str(tmp_path / "dest")))
  for path in source.iterdir():
    assert (folder / path.name).read_bytes() == path.read_bytes()


# --------------------------------------------------------------------------
# The session, end to end.


def _clone(path, results_from=None, entries=(ENTRY,)):
  """A checkout: the code (linked) and a copy of ``results_from``'s results
  (a fresh clone of home), or a queue of ``entries`` (the one tiny run)."""
  path.mkdir(parents=True)
  for name in ("configs", "fkjax", "reproduce"):
    (path / name).symlink_to(REPO / name)
  if results_from is not None:
    shutil.copytree(results_from / "results", path / "results")
  else:
    queue_lib.write(str(path / "results" / queue_lib.QUEUE_FILE),
                    list(entries))
    weights.write_names(str(path / "results"))   # committed in a clone
  return path


def _env(cache, out, **extra):
  env = dict(os.environ)
  env.update({"JAX_COMPILATION_CACHE_DIR": str(cache),
              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
              "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
              "OUT": str(out), "PY": sys.executable, "JOBS": "1", **extra})
  return env


def _lease(clone, cache, out, data, stop_when=None):
  """``gpu_reproduce.sh`` with no arguments in ``clone``; with
  ``stop_when`` (a path), stopped as at its deadline once that exists."""
  stop = clone / "stop"
  env = _env(cache, out, STOP_FILE=str(stop), LOGS=str(clone / "logs"),
             **({"FKJAX_DATA_DIR": str(data)} if data else {}),
             STAGE=str(clone / "stage"), DATA_DEST=str(clone / "data"))
  if not data:
    env.pop("FKJAX_DATA_DIR", None)
  proc = subprocess.Popen(["bash", str(SCRIPT)], cwd=clone, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  if stop_when is not None:
    deadline = time.time() + 600
    while not stop_when.exists() and proc.poll() is None:
      assert time.time() < deadline, "no checkpoint after 600 s"
      time.sleep(0.05)
    stop.touch()
  log, _ = proc.communicate(timeout=900)
  assert proc.returncode == 0, log
  return log


def _unpack(home, folder):
  """``python -m reproduce unpack FOLDER`` at ``home``: its main in this
  process (it reports from files; no JAX), its output."""
  here = os.getcwd()
  out = io.StringIO()
  os.chdir(home)
  try:
    with contextlib.redirect_stdout(out):
      assert reproduce_main.main(["unpack", str(folder)]) == 0
  finally:
    os.chdir(here)
  return out.getvalue()


def _tree_digest(folder):
  h = hashlib.sha256()
  for path in sorted(Path(folder).rglob("*")):
    h.update(str(path.relative_to(folder)).encode())
    if path.is_file():
      h.update(path.read_bytes())
  return h.hexdigest()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("session")
  cache = tmp / "cache"
  data = tmp / "data"
  _release(data)   # the tiny scale trains on synthetic images
  # A lease never stopped.
  reference = _clone(tmp / "reference")
  _lease(reference, cache, tmp / "out_reference", data)
  # A lease stopped mid-run (after its first epoch's checkpoint), home
  # unpacks it, a fresh clone of home finishes it, home unpacks that.
  home = _clone(tmp / "home")
  first = _clone(tmp / "lease1", results_from=home)
  _lease(first, cache, tmp / "out1", data,
         stop_when=first / WORKDIR / "checkpoints" / "4")
  unpacked_first = _unpack(home, tmp / "out1")
  carried_after_first = (home / CARRIED).exists()
  if carried_after_first:
    shutil.copy(home / CARRIED, tmp / "carried.tar.xz")
  second = _clone(tmp / "lease2", results_from=home)
  second_log = _lease(second, cache, tmp / "out2", data)
  unpacked_second = _unpack(home, tmp / "out2")
  return {"tmp": tmp, "reference": reference, "home": home, "first": first,
          "second": second, "second_log": second_log,
          "unpacked_first": unpacked_first,
          "unpacked_second": unpacked_second,
          "carried_after_first": carried_after_first}


@pytest.mark.slow   # the session fixture: two leases end to end
def test_a_stopped_run_is_carried_home_and_resumed_elsewhere(session):
  out1 = json.loads((session["tmp"] / "out1" / lease.MANIFEST).read_text())
  assert out1["finished"] == [] and out1["carried"] == [ENTRY.name]
  assert session["carried_after_first"]
  assert "0 done, 1 carried" in session["unpacked_first"]
  # what came back stays within the device tool's limits
  for path in (session["tmp"] / "out1").iterdir():
    assert path.stat().st_size <= 16 << 20
  # the carried state: the last checkpoint (and the best), no lock
  with tarfile.open(session["tmp"] / "carried.tar.xz") as tar:
    names = tar.getnames()
  assert "config.json" in names and "fkjax.lock" not in names
  steps = {n.split("/")[1] for n in names if n.startswith("checkpoints/")}
  assert 1 <= len(steps) <= 2
  # the second lease resumed it rather than training from the start (its
  # jobs' logs come back with it)
  log = (session["tmp"] / "out2" / "logs" / "job1.log").read_text()
  assert "resumed from step" in log


@pytest.mark.slow   # the session fixture: two leases end to end
def test_the_finished_run_equals_a_run_never_stopped(session):
  home, reference = session["home"], session["reference"]
  assert "1 done, 0 carried" in session["unpacked_second"]
  assert not (home / CARRIED).exists(), "a finished run's carry is removed"
  got = json.loads((home / RUN / runner.RUN_RECORD).read_text())
  want = json.loads((reference / RUN / runner.RUN_RECORD).read_text())
  assert got["metrics"] == want["metrics"]
  assert got["stage_attempts"]["train"] == 2
  for name in ("eval_paper.json",):
    a = json.loads((home / RUN / name).read_text())
    b = json.loads((reference / RUN / name).read_text())
    assert a["correct_per_image"] == b["correct_per_image"]
  from fkjax.checkpoint import weights_file as weights  # pylint: disable=C0415
  a = weights.flatten(weights.load(str(home / RUN / weights.WEIGHTS_FILE)))
  b = weights.flatten(weights.load(str(reference / RUN /
                                       weights.WEIGHTS_FILE)))
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  # home's tables were rewritten from the run
  table = json.loads((home / "results/tiny/table1.json").read_text())
  row = next(r for r in table["rows"] if r["name"] == "resnet20_none")
  assert row["runs"][0]["metrics"] == want["metrics"]
  state = (home / "results/queue.md").read_text()
  assert "| 1 | tiny/table1/resnet20_none/seed0 | done |" in state
  size = (home / RUN / weights.WEIGHTS_FILE).stat().st_size
  assert f"Published weights: 1 run(s), {size / 1e6:.1f} MB" in state


@pytest.mark.slow   # the session fixture: two leases end to end
def test_data_crosses_in_parts_then_a_lease_with_nothing_left_ends(
    session, tmp_path):
  clone = _clone(tmp_path / "again", results_from=session["home"])
  manifest = datapack.pack(str(session["tmp"] / "data"),
                           str(tmp_path / "parts"), part_bytes=20_000)
  # each call carries the manifest and the next part (.datapack/), as a
  # session's consecutive calls do; the machine keeps what was staged
  for i, part in enumerate(manifest["parts"]):
    shutil.rmtree(clone / ".datapack", ignore_errors=True)
    (clone / ".datapack").mkdir()
    for name in (datapack.MANIFEST, part["name"]):
      shutil.copy(tmp_path / "parts" / name, clone / ".datapack")
    log = _lease(clone, session["tmp"] / "cache", tmp_path / f"out{i}", None)
    if i + 1 < len(manifest["parts"]):
      assert "CIFAR-10 not complete yet" in log
      assert f"{i + 1} of {len(manifest['parts'])} parts staged" in log
  assert "CIFAR-10 written to" in log
  assert (clone / "data" / datapack.FOLDER / "test_batch.bin").read_bytes() \
      == (session["tmp"] / "data" / datapack.FOLDER / "test_batch.bin"
          ).read_bytes()
  assert "the queue has no run left" in log


@pytest.mark.slow   # the session fixture: two leases end to end
def test_a_published_run_loads_by_name_and_evaluates_without_training(
    session, tmp_path):
  from fkjax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  from fkjax.training import sparsify  # pylint: disable=import-outside-toplevel
  results = str(session["reference"] / "results")
  assert pretrained.available(results) == ["tiny/table1/resnet20_none/seed0"]
  # Table 5's row is Table 1's run, loaded by either name
  model, variables, config, record = pretrained.load(
      "tiny/table5/resnet20_skip/seed0", results)
  assert record["metrics"] == json.loads(
      (session["reference"] / RUN / runner.RUN_RECORD).read_text())["metrics"]
  workdir = str(session["reference"] / WORKDIR)
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = build.Experiment.build(config)
    _, state = exp.restore(checkpointer, config.eval.checkpoint)
  evaluated = sparsify.eval_variables(state, config)
  for a, b in zip(jax_leaves(evaluated), jax_leaves(variables)):
    np.testing.assert_array_equal(np.asarray(a), b)
  images = np.zeros((2, 32, 32, 3), np.float32)
  import jax  # pylint: disable=C0415
  logits = model.apply(variables, images, train=False,
                       rngs={"noise": jax.random.PRNGKey(0)})
  assert logits.shape == (2, 10)
  # written into a workdir, eval.py evaluates it to the run's numbers
  target = tmp_path / "published"
  # `python -m fkjax.pretrained NAME --workdir=...`'s main, in this process
  assert pretrained.main(["tiny/table1/resnet20_none/seed0",
                          f"--workdir={target}",
                          f"--results={results}"]) == 0
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={target}",
       "--config.progress=False"], cwd=REPO, capture_output=True, text=True,
      timeout=600, env=_env(session["tmp"] / "cache", tmp_path))
  assert proc.returncode == 0, proc.stderr
  got = json.loads((target / "eval_paper.json").read_text())
  want = json.loads((session["reference"] / RUN / "eval_paper.json")
                    .read_text())
  assert got["correct_per_image"] == want["correct_per_image"]


def jax_leaves(tree):
  import jax  # pylint: disable=C0415
  return jax.tree.leaves(tree)


@pytest.mark.slow   # the session fixture: two leases end to end
def test_unknown_or_unpublished_names_are_one_clear_error(session):
  results = str(session["reference"] / "results")
  with pytest.raises(pretrained.PretrainedError, match="is not <scale>"):
    pretrained.load("table1/resnet20_none", results)
  with pytest.raises(pretrained.PretrainedError, match="no published"):
    pretrained.load("tiny/table1/en2resnet20_none/seed0", results)
  with pytest.raises(pretrained.PretrainedError, match="has no row"):
    pretrained.load("tiny/table1/resnet99/seed0", results)


@pytest.mark.slow   # the session fixture: two leases end to end
def test_a_dry_run_writes_nothing(session, tmp_path, capsys):
  home = session["home"]
  before = _tree_digest(home / "results")
  root = tmp_path / "w"
  capsys.readouterr()
  assert reproduce_main.main(
      ["table5", "--scale=tiny", "--rows=resnet20_skip", "--dry-run",
       f"--root={root}", f"--results={home / 'results'}"]) == 0
  assert "resnet20_skip seed 0 (shared: table1/resnet20_none): done" in (
      capsys.readouterr().out)
  assert not root.exists()
  assert _tree_digest(home / "results") == before


# --------------------------------------------------------------------------
# A sweep unit carried between leases: the queue merges a row's seeds into
# one unit, trained as one vmapped program (fkjax.training.sweep); every run's last
# checkpoint crosses to the next lease.

# At the tiny scale every net is depth 8: this row has the session's run's
# config, and Table 3 has no extra evaluation to pay for.
SWEEP = [queue_lib.Entry("tiny", "table3", "resnet38_none", s)
         for s in (0, 1)]


def _kept(home, entry):
  return home / entry.archive("results")


def _workdir(clone, entry):
  return clone / entry.workdir("workdirs/reproduce")


def _assert_same_run(got, want):
  """Two kept runs (their folders under results/): the same numbers,
  per-image correctness and published weights, bit for bit."""
  a = json.loads((got / runner.RUN_RECORD).read_text())
  b = json.loads((want / runner.RUN_RECORD).read_text())
  assert a["metrics"] == b["metrics"]
  evals = sorted(p.name for p in want.glob("eval_*.json"))
  assert "eval_paper.json" in evals
  assert evals == sorted(p.name for p in got.glob("eval_*.json"))
  for name in evals:
    x = json.loads((got / name).read_text())
    y = json.loads((want / name).read_text())
    if name == "eval_paper.json" or "correct_per_image" in y:
      assert x["correct_per_image"] == y["correct_per_image"], name
  x = weights_file.flatten(weights_file.load(str(got / "weights.npz")))
  y = weights_file.flatten(weights_file.load(str(want / "weights.npz")))
  assert x.keys() == y.keys()
  for key in x:
    np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.fixture(scope="module")
def sweep_session(session):
  """A queue of a one-run unit (the session's run) and a 2-seed sweep unit:
  the first lease finishes the first unit and is stopped after the sweep's
  first checkpoint; home unpacks it; a lease in a fresh clone of home
  resumes the sweep; home unpacks that. Beside it the sweep unit in a lease
  never stopped. The session's compilation cache and data serve here."""
  tmp = session["tmp"]
  cache, data = tmp / "cache", tmp / "data"
  reference = _clone(tmp / "sweep_reference", entries=SWEEP)
  _lease(reference, cache, tmp / "sweep_out_reference", data)
  home = _clone(tmp / "sweep_home", entries=[ENTRY, *SWEEP])
  first = _clone(tmp / "sweep_lease1", results_from=home)
  # the sweep saves its runs one after the other: stopped once the last
  # has its first epoch's checkpoint, every run of the unit is carried
  _lease(first, cache, tmp / "sweep_out1", data,
         stop_when=_workdir(first, SWEEP[-1]) / "checkpoints" / "4")
  unpacked_first = _unpack(home, tmp / "sweep_out1")
  carried = {e: (home / e.carry("results")).read_bytes() for e in SWEEP
             if (home / e.carry("results")).exists()}
  second = _clone(tmp / "sweep_lease2", results_from=home)
  _lease(second, cache, tmp / "sweep_out2", data)
  unpacked_second = _unpack(home, tmp / "sweep_out2")
  return {"tmp": tmp, "reference": reference, "home": home,
          "session_run": session["reference"] / RUN,
          "unpacked_first": unpacked_first, "carried": carried,
          "unpacked_second": unpacked_second}


def _manifest(folder):
  return json.loads((folder / lease.MANIFEST).read_text())


@pytest.mark.slow   # two leases end to end, beside a third never stopped
def test_a_lease_stopped_mid_sweep_keeps_the_unit_before_and_carries_each_run(
    sweep_session):
  tmp, home = sweep_session["tmp"], sweep_session["home"]
  out1 = _manifest(tmp / "sweep_out1")
  assert out1["finished"] == [ENTRY.name]
  assert out1["carried"] == [e.name for e in SWEEP]
  assert out1["dropped"] == []
  for path in (tmp / "sweep_out1").iterdir():
    assert path.stat().st_size <= 16 << 20
  # home after the first lease: the first unit done, the sweep carried
  assert "3 runs: 1 done, 2 carried" in sweep_session["unpacked_first"]
  for i, e in enumerate([ENTRY, *SWEEP], 1):
    state = "done" if e == ENTRY else "carried"
    assert f"| {i} | {e.name} | {state} |" in sweep_session["unpacked_first"]
  # each run's own state: its config and its checkpoints, among them the
  # step the sweep resumes from (the earliest of the runs' last ones)
  steps = []
  for e in SWEEP:
    with tarfile.open(fileobj=io.BytesIO(sweep_session["carried"][e])) as t:
      names = t.getnames()
      config = json.load(t.extractfile("config.json"))
    assert "fkjax.lock" not in names
    assert config["seed"] == e.seed
    steps.append({int(n.split("/")[1]) for n in names
                  if n.startswith("checkpoints/")})
  resume = min(max(s) for s in steps)
  assert resume >= 4 and all(resume in s for s in steps), steps
  # the finished unit equals the session's run never stopped
  _assert_same_run(_kept(home, ENTRY), sweep_session["session_run"])


@pytest.mark.slow   # two leases end to end, beside a third never stopped
def test_a_sweep_resumed_in_a_fresh_clone_equals_one_never_stopped(
    sweep_session):
  tmp, home = sweep_session["tmp"], sweep_session["home"]
  reference = sweep_session["reference"]
  out2 = _manifest(tmp / "sweep_out2")
  assert out2["finished"] == [e.name for e in SWEEP]
  assert out2["carried"] == []
  assert sorted(out2["removed"]) == sorted(e.carry("results") for e in SWEEP)
  # the second lease resumed both runs as one program from the carried step
  log = (tmp / "sweep_out2" / "logs" / "job1.log").read_text()
  assert "sweep of 2 runs as one program" in log
  assert "resumed 2 runs from step" in log
  assert "3 runs: 3 done, 0 carried" in sweep_session["unpacked_second"]
  for i, e in enumerate([ENTRY, *SWEEP], 1):
    assert f"| {i} | {e.name} | done |" in sweep_session["unpacked_second"]
    assert not (home / e.carry("results")).exists()
  for e in SWEEP:
    record = json.loads((_kept(home, e) / runner.RUN_RECORD).read_text())
    assert record["train_sweep_runs"] == 2
    assert record["stage_attempts"]["train"] == 2
    _assert_same_run(_kept(home, e), _kept(reference, e))
  # the two seeds are two runs, not one run twice
  a, b = (weights_file.flatten(weights_file.load(
      str(_kept(home, e) / "weights.npz"))) for e in SWEEP)
  assert any(not np.array_equal(a[k], b[k]) for k in a)


def test_carry_keeps_only_the_last_and_best_checkpoints(tmp_path):
  workdir = tmp_path / "w"
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  (workdir / "checkpoints" / "4" / "state").write_text("old")
  (workdir / "checkpoints" / "8.orbax-checkpoint-tmp-1").mkdir()
  (workdir / "config.json").write_text("{}")
  (workdir / "fkjax.lock").write_text("pid")
  rel = [r for r in ("config.json", "fkjax.lock", "checkpoints/4/state",
                     "checkpoints/8.orbax-checkpoint-tmp-1/x")
         if carry._wanted(r, [8])]
  assert rel == ["config.json"]


def test_a_sweep_stopped_between_its_runs_saves_is_carried_to_resume_whole(
    tmp_path, monkeypatch):
  # A sweep saves its runs one after the other: a lease stopped in between
  # leaves seed 1 a save ahead (steps 4 and 8, the best 8) and seed 2 at 4.
  # The next lease resumes the sweep from step 4, which seed 1 must carry
  # besides its last and best (else the sweep refuses runs at different
  # steps and each trains alone). Seed 0 finished in an earlier lease: it
  # has no workdir here and is not in the sweep.
  from fkjax import checkpoint  # pylint: disable=C0415
  from fkjax.training.sweep import loop  # pylint: disable=C0415
  monkeypatch.chdir(tmp_path)
  done, *entries = [queue_lib.Entry("tiny", "table1", "resnet20_none", s)
                    for s in (0, 1, 2)]
  Path(done.archive("results")).mkdir(parents=True)
  (Path(done.archive("results")) / runner.RUN_RECORD).write_text(
      json.dumps({"done": True}))
  state = {"w": np.arange(3, dtype=np.float32)}
  for entry, saves in zip(entries, [((4, 50.0), (8, 60.0)), ((4, 50.0),)]):
    checkpointer = checkpoint.Checkpointer(entry.workdir("lent"))
    for step, accuracy in saves:
      checkpointer.save(step, state, val_accuracy=accuracy)
    checkpointer.close()
  # home has seed 0's record: not brought back again
  manifest = lease.gather([done, *entries], "results", "lent",
                          sent=ledger.kept_runs([done], "results"))
  assert manifest["finished"] == []
  assert manifest["carried"] == [e.name for e in entries]
  checkpointers = []
  for entry in entries:
    assert carry.unpack(entry.carry("results"), entry.workdir("next"))
    checkpointers.append(checkpoint.Checkpointer(entry.workdir("next")))
  try:
    assert [c.all_steps() for c in checkpointers] == [[4, 8], [4]]
    assert loop.resume_step(checkpointers, ["seed1", "seed2"],
                            steps_per_epoch=4, every=0) == 4
  finally:
    for c in checkpointers:
      c.close()


def test_the_carry_benchmark_packs_a_checkpoint_at_each_preset(tmp_path):
  # benchmarks/bench_carry.py, on a tiny state: what docs/reproduction.md
  # states comes from it; a preset changes the bytes, never the contents.
  from benchmarks import bench_carry  # pylint: disable=C0415
  rng = np.random.default_rng(0)
  state = {"params": {"kernel": rng.standard_normal((3, 3, 8, 8)).astype(
      np.float32)}, "step": np.int32(4)}
  rows = bench_carry.measure(state, [0, 6], str(tmp_path))
  assert [r["preset"] for r in rows] == [0, 6]
  assert all(0 < r["bytes"] < 2 * r["raw"] for r in rows)
  unpacked = [_tree_digest(tmp_path / f"u{p}" / "checkpoints")
              for p in (0, 6)]
  assert unpacked[0] == unpacked[1] == _tree_digest(
      tmp_path / "w" / "checkpoints")


def test_a_kept_run_with_an_evaluation_pending_stays_carried(tmp_path):
  # A lease can end after a run's record (A1-A4) and before its A5: while
  # its checkpoint is carried the queue is not done with it.
  entry = queue_lib.Entry("tiny", "table2", "resnet20_rgsm_l0.05", 0)
  results = str(tmp_path / "results")
  run = runner.plan(tables.TABLES["table2"], scales.SCALES["tiny"],
                    root=str(tmp_path / "w"), rows=[entry.row], seeds=1)[0]
  now = runner.fingerprints(run)
  kept = Path(entry.archive(results))
  kept.mkdir(parents=True)

  def record(stages):
    (kept / runner.RUN_RECORD).write_text(json.dumps(
        {"done": True, "fingerprints": {k: now[k] for k in stages}}))
  record(["train", "eval"])
  assert queue_lib.pending_evals(entry, results) == ["eval_a5",
                                                     "eval_strong"]
  # nothing to evaluate it with: reported as it is
  assert queue_lib.state(entry, results) == queue_lib.DONE
  Path(entry.carry(results)).parent.mkdir(parents=True)
  Path(entry.carry(results)).write_bytes(b"checkpoint")
  assert queue_lib.state(entry, results) == queue_lib.CARRIED
  assert queue_lib.next_units([entry], results, 1)[0].row == entry.row
  record(["train", "eval", "eval_a5", "eval_strong"])
  assert queue_lib.state(entry, results) == queue_lib.DONE


def test_a_lease_brings_back_what_fits_and_home_checks_the_parts(
    tmp_path, monkeypatch):
  # Two unfinished runs whose states together exceed the limit: the first
  # in queue order comes back, the second is named as dropped.
  lent = tmp_path / "lent"
  entries = [queue_lib.Entry("tiny", "table1", r, 0)
             for r in ("resnet20_none", "en2resnet20_none")]
  rng = np.random.default_rng(0)
  for e in entries:
    state = lent / e.workdir("workdirs") / "checkpoints" / "8"
    state.mkdir(parents=True)
    (state / "arrays").write_bytes(rng.bytes(30_000))   # incompressible
    (lent / e.workdir("workdirs") / "config.json").write_text("{}")
  monkeypatch.setattr(carry, "kept_steps", carry.checkpoint_steps)
  monkeypatch.chdir(lent)
  manifest = lease.gather(entries, "results", "workdirs", sent={},
                          max_bytes=45_000)
  assert manifest["carried"] == [entries[0].name]
  assert manifest["dropped"] == [entries[1].name]
  parts = lease.write_parts(manifest, str(tmp_path / "out"), str(lent),
                            part_bytes=10_000)
  assert len(parts) >= 3
  assert all((tmp_path / "out" / p).stat().st_size <= 10_000 for p in parts)
  home = tmp_path / "home"
  home.mkdir()
  lease.unpack(str(tmp_path / "out"), str(home))
  assert (home / entries[0].carry("results")).read_bytes() == (
      lent / entries[0].carry("results")).read_bytes()
  assert not (home / entries[1].carry("results")).exists()
  # a damaged part is refused, naming why
  with open(tmp_path / "out" / parts[1], "r+b") as f:
    f.write(b"x")
  with pytest.raises(ValueError, match="a part is damaged"):
    lease.unpack(str(tmp_path / "out"), str(home))


def test_finished_runs_over_the_limit_come_back_with_the_next_call(
    tmp_path, monkeypatch):
  # Finished runs past the limit would make parts the device tool does not
  # bring back (and home refuses a tar with a part missing): the last one
  # waits, unsent in the ledger, for the next call.
  monkeypatch.chdir(tmp_path)
  entries = [queue_lib.Entry("tiny", "table1", r, 0)
             for r in ("resnet20_none", "en2resnet20_none")]
  for e in entries:
    kept = Path(e.archive("results"))
    kept.mkdir(parents=True)
    (kept / runner.RUN_RECORD).write_text('{"done": true}')
    (kept / weights.WEIGHTS_FILE).write_bytes(os.urandom(30_000))
    # a write that a killed call cut short is no part of the run
    (kept / f".{weights.WEIGHTS_FILE}.x1.tmp").write_bytes(b"cut")
  first = lease.gather(entries, "results", "w", ledger.load("w"),
                       max_bytes=45_000)
  assert (first["finished"], first["dropped"]) == ([entries[0].name],
                                                   [entries[1].name])
  assert sorted(Path(p).name for p in first["files"]) == [
      runner.RUN_RECORD, weights.WEIGHTS_FILE]
  ledger.add("w", first["digests"])
  second = lease.gather(entries, "results", "w", ledger.load("w"),
                        max_bytes=45_000)
  assert (second["finished"], second["dropped"]) == ([entries[1].name], [])


def test_a_lease_on_a_bad_queue_fails_saying_why(tmp_path):
  clone = _clone(tmp_path / "bad")
  (clone / "results" / queue_lib.QUEUE_FILE).write_text('{"runs": [{}]}')
  env = _env(tmp_path / "cache", tmp_path / "out", LOGS=str(clone / "logs"),
             FKJAX_DATA_DIR=str(_release(tmp_path / "data").parent))
  proc = subprocess.run(["bash", str(SCRIPT)], cwd=clone, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert "error: a queue is" in proc.stderr
  assert "the queue could not be read" in proc.stdout


def _documented_timeout():
  """The ``timeout_s`` that docs/reproduction.md gives the training call,
  which tells the script so (``LIMIT``): a call cut shorter than the script
  thinks is killed before its pack."""
  docs = (REPO / "docs" / "reproduction.md").read_text()
  calls = re.findall(r'run\(command="LIMIT=(\d+) bash benchmarks/'
                     r'gpu_reproduce\.sh"[^)]*timeout_s=(\d+)\)', docs)
  assert len(set(calls)) == 1, calls
  limit, timeout = map(int, calls[0])
  assert limit == timeout
  return timeout


def test_a_lease_stops_its_jobs_a_stated_margin_before_the_calls_limit(
    tmp_path):
  # Queue mode packs once, after its deadline: a call the device tool kills
  # at its timeout_s brings back nothing. The script's default limit is the
  # documented timeout_s, and it says what it keeps to stop and pack.
  clone = _clone(tmp_path / "c")
  (clone / "results" / queue_lib.QUEUE_FILE).write_text('{"runs": [{}]}')
  env = _env(tmp_path / "cache", tmp_path / "out", LOGS=str(clone / "logs"),
             FKJAX_DATA_DIR=str(_release(tmp_path / "data").parent))
  env.pop("DEADLINE", None)
  env.pop("LIMIT", None)
  env.pop("MARGIN", None)
  timeout = _documented_timeout()
  proc = subprocess.run(["bash", str(SCRIPT)], cwd=clone, env=env,
                        capture_output=True, text=True, timeout=300)
  stated = re.search(r"deadline (\d+)s: (\d+) s before the call's limit of "
                     r"(\d+)s \(timeout_s\)", proc.stdout)
  assert stated, proc.stdout
  deadline, margin, limit = map(int, stated.groups())
  assert limit == timeout and deadline + margin == limit
  assert margin >= 60, "stopping the jobs and packing need the time"
  # a deadline that leaves less is refused before anything runs
  proc = subprocess.run(["bash", str(SCRIPT)], cwd=clone, env={
      **env, "DEADLINE": str(timeout - margin + 1)}, capture_output=True,
      text=True, timeout=60)
  assert proc.returncode == 2
  assert proc.stderr.count("\n") == 1
  assert f"leaves {margin - 1} s of the call's LIMIT={timeout} s" in (
      proc.stderr)
  assert "job 1" not in proc.stdout


def _stand_in_python(folder):
  """A ``python`` for the lease script: the lease's own steps
  (``-m reproduce.lease``) run for real; a unit's command ``-m reproduce
  <table> --scale=S --rows=R --seeds=N --sweep`` "finishes" its seeds at
  once (their kept records) where R is in $FINISH, and leaves them
  unfinished otherwise; with $KILL_AT_PACK set, the pack kills the script
  first, as the device tool does at the call's timeout_s."""
  script = folder / "python"
  script.write_text(f"""#!/bin/bash
if [ "$2" = reproduce.lease ]; then
  if [ "$3" = pack ] && [ -n "${{KILL_AT_PACK:-}}" ]; then
    kill -KILL $PPID; exit 137
  fi
  exec {sys.executable} "$@"
fi
table=$3
for a in "$@"; do case $a in --scale=*) scale=${{a#*=}};;
  --rows=*) row=${{a#*=}};; --seeds=*) seeds=${{a#*=}};; esac; done
case " $FINISH " in *" $row "*) ;; *) exit 0;; esac
for ((k = 0; k < seeds; k++)); do
  d=results/$scale/runs/$table/${{row}}_seed$k
  mkdir -p $d && echo '{{"done": true, "seed": '$k'}}' > $d/reproduce_run.json
done
""")
  script.chmod(0o755)
  return str(script)


def test_a_call_killed_before_its_pack_is_brought_back_by_the_next(tmp_path):
  # Two calls on one still-warm machine (one checkout, its untracked files
  # kept): the first finishes run A and is killed before it packs; the next
  # finishes B and must bring back A too (home has neither); a third brings
  # back nothing again.
  a, b = ENTRY, SWEEP[0]
  clone = _clone(tmp_path / "machine", entries=[a, b])
  data = _release(tmp_path / "data").parent
  python = _stand_in_python(tmp_path)

  def call(out, **env):
    env = _env(tmp_path / "cache", tmp_path / out, PY=python,
               LOGS=str(tmp_path / "logs"), FKJAX_DATA_DIR=str(data), **env)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, tmp_path / out / lease.MANIFEST

  proc, manifest = call("out1", FINISH=a.row, KILL_AT_PACK="1")
  assert proc.returncode == -9 and not manifest.exists(), proc.stdout
  proc, manifest = call("out2", FINISH=b.row)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert json.loads(manifest.read_text())["finished"] == [a.name, b.name]
  proc, manifest = call("out3", FINISH="")
  assert "the queue has no run left" in proc.stdout
  assert json.loads(manifest.read_text())["finished"] == []
