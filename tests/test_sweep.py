"""Sweeps (fkjax.training.sweep): runs as one program equal the runs trained alone.

The whole-run tests train a 2-run RGSM sweep through ``train.py`` (the runs
differ in every traced key and in their seed), each run alone from its
``config.json``, the sweep killed with ``kill -9`` and resumed, and the
sweep resumed with one run a save ahead of the other. The subprocesses
share a persistent compilation cache, so only the first of each program
compiles. ``tests/sweep_devices.py`` checks the step on 4 host devices.
"""
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import sweep as sweep_config
from configs import tiny
from fkjax import checkpoint as ckpt_lib
from fkjax.training import build
from fkjax.training import sparsify
from fkjax.config import record as run_config
from fkjax import sparsity
from fkjax.training import sweep
from tests import sweep_devices
from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------
# What a sweep may vary, and config.sweep.


def test_expand_product_and_zip_name_every_run():
  config = sweep_config.get_config("tiny,rgsm")
  config.sweep.product = "seed=0,1"
  config.sweep.zip = "sparsity.beta=0.5,1; sparsity.lamb1=0.1,0.2"
  runs = sweep.expand(config)
  assert [name for name, _, _ in runs] == [
      "00_seed-0_beta-0.5_lamb1-0.1", "01_seed-0_beta-1_lamb1-0.2",
      "02_seed-1_beta-0.5_lamb1-0.1", "03_seed-1_beta-1_lamb1-0.2"]
  _, overrides, run = runs[3]
  assert overrides == {"seed": 1, "sparsity.beta": 1.0, "sparsity.lamb1": 0.2}
  assert (run.seed, run.sparsity.beta, run.sparsity.lamb1) == (1, 1.0, 0.2)
  assert isinstance(run.sparsity.beta, float)
  assert "sweep" not in run   # a run's config is a single run's
  assert sweep.check_configs([r for _, _, r in runs]) == (
      "seed", "sparsity.beta", "sparsity.lamb1")


@pytest.mark.parametrize("product,zipped,match", [
    ("model.depth=8,14", "", "config.model.depth cannot be swept"),
    ("seed=0.5", "", "seed=0.5 is not an integer"),
    ("seed", "", "is not KEY=V1,V2"),
    ("", "seed=0,1; sparsity.lamb=1e-3", "as many values"),
    ("seed=0", "seed=1", "in both product and zip"),
    ("sparsity.lamb=abc", "", "is not a number"),
    ("seed=0,1,0", "", r"runs 00_seed-0 and 02_seed-0 are the same run "
     r"\(seed=0\)"),
    ("sparsity.lamb=1e-6,0.000001", "", "are the same run"),
    ("seed=0,1", "seed=", "has no values"),
])
def test_bad_sweep_sections_fail_in_one_line(product, zipped, match):
  config = sweep_config.get_config("tiny")
  config.sweep.product, config.sweep.zip = product, zipped
  with pytest.raises(run_config.ConfigError, match=match) as e:
    sweep.expand(config)
  assert "\n" not in str(e.value)


def test_groups_gather_runs_that_differ_only_in_sweepable_keys():
  configs = [tiny.get_config(p) for p in ("rvsm", "rvsm", "rgsm", "rvsm",
                                          "rvsm")]
  configs[1].seed, configs[1].sparsity.lamb = 1, 1e-3
  configs[3].model.width = 2
  configs[4].training.learning_rate = 0.05
  assert sweep.groups(configs) == [[0, 1, 4], [2], [3]]
  assert sweep.groups(configs, max_size=2) == [[0, 1], [4], [2], [3]]
  more = [tiny.get_config() for _ in range(7)]
  assert sweep.groups(more, max_size=3) == [[0, 1, 2], [3, 4], [5, 6]]
  configs[4].training.weight_decay = 0.0   # 0 removes the decay term
  assert sweep.groups(configs) == [[0, 1], [2], [3], [4]]


def test_runs_differing_in_a_shape_fail_in_one_line():
  a, b = tiny.get_config(), tiny.get_config()
  b.model.width = 2
  with pytest.raises(run_config.ConfigError) as e:
    sweep.check_configs([a, b], names=["a", "b"])
  message = str(e.value)
  assert "\n" not in message
  assert "b has config.model.width=2, a has 1" in message
  assert "sparsity.lamb1" in message   # says what may differ


def test_zero_and_nonzero_noise_are_separate_sweeps():
  a, b = tiny.get_config(), tiny.get_config()
  b.model.noise_coef = 0.0
  with pytest.raises(run_config.ConfigError, match="model.noise_coef is 0 in "
                     "some runs"):
    sweep.check_configs([a, b])
  b.model.noise_coef = 0.3   # both non-zero: sweepable
  assert sweep.check_configs([a, b]) == ("model.noise_coef",)


def test_an_invalid_run_is_named():
  a, b = tiny.get_config(), tiny.get_config()
  b.sparsity.beta = 0.0
  with pytest.raises(run_config.ConfigError, match=r"^run 1: .*beta=0\.0 is "
                     "out of range"):
    sweep.check_configs([a, b])


def test_shared_data_order_records_the_data_seed():
  configs = [tiny.get_config() for _ in range(3)]
  for seed, c in zip((4, 5, 4), configs):
    c.seed = seed
  shared = sweep.with_data_seed(configs, "shared")
  assert [c.training.data_seed for c in shared] == [None, 4, None]
  assert [build.data_seed(c) for c in shared] == [4, 4, 4]
  own = sweep.with_data_seed(configs, "per_run")
  assert [build.data_seed(c) for c in own] == [4, 5, 4]
  assert configs[1].training.data_seed is None   # inputs left alone
  with pytest.raises(run_config.ConfigError, match="data_order"):
    sweep.with_data_seed(configs, "random")
  # data seeds a user set are never overridden
  configs[0].training.data_seed, configs[2].training.data_seed = 7, 8
  with pytest.raises(run_config.ConfigError, match=r"different config\."
                     r"training\.data_seed values \(\[7, 8\]\).*per_run"):
    sweep.with_data_seed(configs, "shared")


def test_sparsifiers_check_every_value_of_an_array():
  # A sweep's stacked values: each is checked, the bad one named.
  with pytest.raises(ValueError, match=r"rvsm: beta\[1\]=0\.0 is out of "
                     r"range; valid range beta in \(0, inf\)"):
    sparsity.get_sparsifier("rvsm", beta=np.array([0.5, 0.0, 1.0]),
                            lamb=1e-6)
  sp = sparsity.get_sparsifier("rgsm", beta=np.array([0.5, 1.0]),
                               lamb1=np.array([0.1, 0.2]), lamb2=0.0)
  assert sp.hparams["beta"].shape == (2,)
  with pytest.raises(ValueError, match="Unknown ADMM structure"):
    sparsity.ADMMSpec(structure="filters", group="input")


class _FakeCheckpointer:

  def __init__(self, *steps):
    self.steps = list(steps)

  def latest_step(self):
    return max(self.steps) if self.steps else None

  def all_steps(self):
    return self.steps


def test_resume_step_takes_runs_at_most_one_save_apart():
  ck = _FakeCheckpointer
  # 4 steps an epoch, a checkpoint every 2: saves at 2, 4, 6, ...
  assert sweep.resume_step([ck(), ck()], "ab", 4, 2) is None
  assert sweep.resume_step([ck(4, 6), ck(4, 6)], "ab", 4, 2) == 6
  # killed between the two runs' saves of step 6, or of the first save
  assert sweep.resume_step([ck(4, 6), ck(2, 4)], "ab", 4, 2) == 4
  assert sweep.resume_step([ck(2), ck()], "ab", 4, 2) is None
  with pytest.raises(run_config.ConfigError, match=r"different steps \(a: "
                     r"8, b: 4\)"):
    sweep.resume_step([ck(6, 8), ck(2, 4)], "ab", 4, 2)
  assert sweep.resume_step([ck(4), ck()], "ab", 4, 0) is None
  with pytest.raises(run_config.ConfigError, match="different steps"):
    sweep.resume_step([ck(4, 8), ck()], "ab", 4, 0)


# --------------------------------------------------------------------------
# Several devices.


@pytest.mark.slow   # a subprocess compiling the step three ways
def test_runs_or_batch_sharded_over_four_devices_agree_with_one():
  proc = subprocess.run([sys.executable, "-m", "tests.sweep_devices"],
                        cwd=REPO, env=subprocess_env(devices=4),
                        capture_output=True,
                        text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["devices"] == 4
  place = result["placement"]
  # shard="runs": each device holds one of the 4 runs' parameters
  assert place["runs4"]["devices"] == 4
  assert place["runs4"]["shard_shape"][0] == 1
  # shard="batch": every device holds every run, the batch is split
  assert place["batch4"]["devices"] == 4
  assert place["batch4"]["shard_shape"][0] == 4
  # The runs really differ (seeds and hyperparameters) ...
  assert result["spread"] > 1e-2
  # ... and each equals its computation alone on one device, to rounding
  # (see sweep_devices.py) up to weights that RVSM's hard threshold keeps in
  # one and zeroes in the other (none measured with oneDNN's convolutions;
  # XLA's gave one).
  for key in ("runs4_vs_single3", "batch4_vs_single3", "batch4_vs_runs4"):
    assert result[key]["unexplained"] == 0, (key, result[key])
    assert result[key]["flip_share"] < 1e-3, (key, result[key])
  losses = result["losses"]
  np.testing.assert_allclose(losses["batch4"], losses["runs4"], rtol=1e-4)
  np.testing.assert_allclose(losses["runs4"][3], losses["single3"],
                             rtol=1e-5)


# --------------------------------------------------------------------------
# Whole runs through train.py.

# Run 1 differs from run 0 in its seed and in every traced key.
ZIP = ("seed=0,1; sparsity.lamb1=0.8,0.6; sparsity.beta=1.0,0.8; "
       "sparsity.lamb2=1e-5,1e-3; training.weight_decay=5e-4,1e-3; "
       "model.noise_coef=0.1,0.2; training.learning_rate=0.1,0.05; "
       "attack.epsilon=0.0314,0.0235; attack.step_size=0.0078,0.0059")
FLAGS = [
    "--config=configs/sweep.py:tiny,rgsm", "--config.sweep.product=",
    f"--config.sweep.zip={ZIP}", "--config.num_devices=1",
    "--config.dataset.synthetic_sizes=(64,32)",
    "--config.training.num_epochs=2", "--config.attack.num_steps=1",
    "--config.validation.attack_steps=0", "--config.validation.batch_size=32",
    "--config.eval.batch_size=32", "--config.eval.final_attacks=natural",
]


def _train(workdir, cache, check=True):
  proc = subprocess.run(
      [sys.executable, "train.py", f"--workdir={workdir}", *FLAGS], cwd=REPO,
      env=subprocess_env(cache), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  if check and proc.returncode != 0:
    raise AssertionError(f"train.py failed:\n{proc.stdout}\n{proc.stderr}")
  return proc


def _runs(workdir):
  record = json.loads((Path(workdir) / sweep.SWEEP_FILE).read_text())
  return [Path(workdir) / r["name"] for r in record["runs"]]


def _restore(workdir, step):
  config = run_config.config_for_eval(str(workdir), None, {}, False)
  exp = build.Experiment.build(config)
  checkpointer = ckpt_lib.Checkpointer(str(workdir), must_exist=True)
  try:
    return jax.device_get(checkpointer.restore(exp.abstract_state(), "latest",
                                               step=step)[1])
  finally:
    checkpointer.close()


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  root = tmp_path_factory.mktemp("sweep")
  cache = root / "jax_cache"
  out = {"root": root}
  out["full"] = root / "full"
  out["full_log"] = _train(out["full"], cache).stdout
  runs = _runs(out["full"])
  proc = subprocess.run(
      [sys.executable, "-m", "tests.sweep_singles", str(root / "alone"),
       *map(str, runs)], cwd=REPO, env=subprocess_env(cache),
      capture_output=True,
      text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out["alone"] = [root / "alone" / r.name for r in runs]

  # kill -9 once the first checkpoint of a run exists, then resume.
  killed = root / "killed"
  proc = subprocess.Popen(
      [sys.executable, "train.py", f"--workdir={killed}", *FLAGS], cwd=REPO,
      env=subprocess_env(cache), stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL)
  marker = killed / runs[0].name / "checkpoints" / "2"
  deadline = time.time() + TIMEOUT_S
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  out["kill_returncode"] = proc.returncode
  out["killed"] = killed
  out["resumed_log"] = _train(killed, cache).stdout

  # Killed between the runs' saves of the last epoch: run 1 is a save behind.
  behind = root / "behind"
  shutil.copytree(out["full"], behind)
  shutil.rmtree(behind / runs[1].name / "checkpoints" / "4")
  for r in runs:
    (behind / r.name / "final_eval.json").unlink()
  out["behind"] = behind
  out["behind_log"] = _train(behind, cache).stdout
  return out


@pytest.mark.slow   # the whole-run fixture: a sweep through train.py, killed and resumed
def test_each_run_of_the_sweep_equals_the_run_alone(whole):
  runs = _runs(whole["full"])
  assert len(runs) == 2
  assert "sweep: 2 runs in one program" in whole["full_log"]
  firsts, finals = [], []
  for run, alone in zip(runs, whole["alone"]):
    # A few steps (the first epoch, projection included): equal up to
    # float32 rounding and the few PGD sign steps it flips (on an AVX-512
    # CPU 2e-7 for the first run and 3e-4 for the second; 7e-5 on
    # an AVX2-only CPU; the two runs differ by more than 1e-2 in 71,000 of
    # their 156,000 weights). The whole run: more flipped sign steps move
    # the weights a little more (3e-3 measured). Both up to
    # channels RGSM's threshold keeps in one and zeroes in the other (none
    # measured). The runs alone use the jnp noise, as the sweep does for its
    # swept noise coefficient (tests/sweep_singles.py).
    for step, atol, kept in ((2, 2e-3, firsts), (4, 1e-2, finals)):
      kept.append(_restore(run, step))
      diff = sweep_devices.compare(kept[-1], _restore(alone, step), atol)
      assert diff["unexplained"] == 0 and diff["flip_share"] < 0.02, (
          run.name, step, diff)
    # Metrics: the single run's records, with the sweep's size added.
    records = [[json.loads(l) for l in open(w / "metrics.jsonl")]
               for w in (run, alone)]
    assert [r["epoch"] for r in records[0]] == [1, 2]
    assert set(records[1][0]) <= set(records[0][0])
    assert records[0][0]["sweep_runs"] == 2
    np.testing.assert_allclose([r["train_loss"] for r in records[0]],
                               [r["train_loss"] for r in records[1]],
                               rtol=1e-3)
    assert (run / "tensorboard").is_dir()
    # The final evaluation, as the single run's file.
    results = [json.loads((w / "final_eval.json").read_text())
               for w in (run, alone)]
    assert set(results[0]) == set(results[1])
    assert results[0]["step"] == results[1]["step"]
    assert abs(results[0]["attacks"]["natural"]["accuracy"]
               - results[1]["attacks"]["natural"]["accuracy"]) <= 100 / 32
    # the same config, but for the noise kernel the runs alone were given
    configs = [dict(r["metadata"]["config"]) for r in results]
    assert configs[1].pop("kernels")["noise"] == "jnp"
    configs[0].pop("kernels")
    assert configs[0] == configs[1]
  # The runs differ (their own seeds and hyperparameters) by far more, at
  # both tolerances.
  assert sweep_devices.compare(*finals, 1e-2)["unexplained"] > 1000
  assert sweep_devices.compare(*firsts, 2e-3)["unexplained"] > 1000


@pytest.mark.slow   # the whole-run fixture: a sweep through train.py, killed and resumed
def test_a_sweep_ends_with_a_table_of_its_runs(whole):
  log = whole["full_log"]
  table = log[log.index("sweep of 2 runs:"):].splitlines()[1:5]
  assert table[0].startswith("| run | attack.epsilon | attack.step_size |")
  assert "| test natural % | sparsity % | channel sparsity % |" in table[0]
  assert [row.split(" | ")[0] for row in table[2:]] == [
      f"| {run.name}" for run in _runs(whole["full"])]


@pytest.mark.slow   # the whole-run fixture: a sweep through train.py, killed and resumed
def test_each_run_is_projected_with_its_own_hyperparameters(whole):
  for run in _runs(whole["full"]):
    config = run_config.config_for_eval(str(run), None, {}, False)
    state = _restore(run, 4)
    report = sparsify.sparsity_report(state["params"], config)
    norms = report.channel_norms()
    threshold = np.sqrt(2 * config.sparsity.lamb1 / config.sparsity.beta)
    # w was replaced by u: a channel group is 0 or above the run's threshold
    assert np.all((norms == 0) | (norms > threshold * (1 - 1e-6)))
    assert report.channel_sparsity > 0


@pytest.mark.slow   # the whole-run fixture: a sweep through train.py, killed and resumed
def test_a_run_of_the_sweep_is_a_single_run_for_eval(whole):
  run = _runs(whole["full"])[1]
  saved = json.loads((run / "config.json").read_text())
  assert "sweep" not in saved
  assert saved["seed"] == 1 and saved["training"]["data_seed"] == 0
  assert saved["sparsity"]["lamb1"] == 0.6
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={run}",
       "--config.eval.attacks=natural", "--config.eval.plots=false"],
      cwd=REPO, env=subprocess_env(whole["root"] / "jax_cache"),
      capture_output=True,
      text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  evaluated = json.loads((run / "eval_paper.json").read_text())
  final = json.loads((run / "final_eval.json").read_text())
  assert evaluated["attacks"]["natural"]["accuracy"] == final["attacks"][
      "natural"]["accuracy"]


@pytest.mark.slow   # the whole-run fixture: a sweep through train.py, killed and resumed
def test_resume_after_kill_matches_uninterrupted_sweep(whole):
  assert whole["kill_returncode"] == -signal.SIGKILL
  for run in _runs(whole["full"]):
    resumed = whole["killed"] / run.name
    full, again = _restore(run, 4), _restore(resumed, 4)
    jax.tree.map(np.testing.assert_array_equal, full, again)
    assert (resumed / "final_eval.json").exists()


@pytest.mark.slow   # the whole-run fixture: a sweep through train.py, killed and resumed
def test_a_run_one_save_behind_is_caught_up(whole):
  assert "resumed 2 runs from step 2" in whole["behind_log"]
  runs = _runs(whole["full"])
  for run in runs:
    jax.tree.map(np.testing.assert_array_equal, _restore(run, 4),
                 _restore(whole["behind"] / run.name, 4))
    assert (whole["behind"] / run.name / "final_eval.json").exists()
  # the run that was ahead keeps its step-4 checkpoint, and its best
  checkpointer = ckpt_lib.Checkpointer(str(whole["behind"] / runs[0].name),
                                       must_exist=True)
  try:
    assert checkpointer.all_steps() == [2, 4]
  finally:
    checkpointer.close()


# --------------------------------------------------------------------------
# The reproduction runner's --sweep.


def test_runner_groups_a_figures_lambdas_and_seeds():
  from reproduce.run import plan as plan_lib  # pylint: disable=C0415
  from reproduce.run import sweeps as sweeps_lib  # pylint: disable=C0415
  from reproduce.spec import scales  # pylint: disable=C0415
  from reproduce.spec import tables  # pylint: disable=C0415
  runs = plan_lib.plan(tables.TABLES["fig45"], scales.SCALES["tiny"],
                       seeds=2, root="/nonexistent")
  groups = [[r.key for r in g] for g in sweeps_lib.sweep_groups(runs)]
  # one sweep per network: its lambda1 values x seeds (rows that Tables 2
  # and 3 own are trained in their workdirs, in the same sweep)
  assert [len(g) for g in groups] == [8, 8]
  assert all("en2resnet20" in k for k in groups[0])
  assert "table2/en2resnet20_rgsm_l0.05_seed1" in groups[0]
  assert all("resnet38" in k for k in groups[1])
  assert [len(g) for g in sweeps_lib.sweep_groups(runs, max_runs=3)] == [
      3, 3, 2, 3, 3, 2]


@pytest.mark.slow
def test_runner_trains_rows_as_one_sweep(tmp_path):
  from reproduce.run import execute as execute_lib  # pylint: disable=C0415
  from reproduce.run import plan as plan_lib  # pylint: disable=C0415
  from reproduce.run import progress as progress_lib  # pylint: disable=C0415
  from reproduce.run import sweeps as sweeps_lib  # pylint: disable=C0415
  from reproduce.spec import scales  # pylint: disable=C0415
  from reproduce.spec import tables  # pylint: disable=C0415
  runs = plan_lib.plan(tables.TABLES["fig45"], scales.SCALES["tiny"],
                       seeds=1,
                       rows=["resnet38_rgsm_l0.02", "resnet38_rgsm_l0.2"],
                       root=str(tmp_path))
  for run in runs:   # the tiny scale, shorter
    run.config.training.num_epochs = 1
    run.config.eval.final_attacks = "natural"
    # In this process: JAX's compilation cache is global and stays set for
    # the tests after this one (tests/test_run_config.py checks the unset
    # case), and the default folder is the user's.
    run.config.compilation_cache_dir = ""
  assert sweeps_lib.train_in_sweeps(runs, show_progress=False) == [
      r.key for r in runs]
  for run in runs:
    # execute() now skips the training stage of each run ...
    assert not sweeps_lib._train_pending(run)  # pylint: disable=protected-access
    progress = progress_lib.Progress(run.workdir)
    assert progress.stage("train")["sweep_runs"] == 2
    assert progress.stage("train")["seconds"] > 0
    # ... whose workdir holds its single run's config and results
    execute_lib.check_workdir(run)
    saved = json.loads((Path(run.workdir) / "config.json").read_text())
    assert saved["training"]["data_seed"] is None
    assert saved["sparsity"]["lamb1"] == run.config.sparsity.lamb1
    assert (Path(run.workdir) / "final_eval.json").exists()
  # trained: nothing left for a second call
  assert sweeps_lib.train_in_sweeps(runs, show_progress=False) == []
