"""End-to-end tests of train.py / eval.py on the tiny synthetic config.

Each training run is a real ``python train.py`` process (the tests also
cover the command line). The quick set keeps a run, its kill and resume,
and what its log and checkpoints hold; the runs beyond those (eval.py,
export.py, a second writer, divergence, ADMM's readings, the 1- and
4-device comparison) are in the slow set here, and a two-process
jax.distributed run and eval.py's strong protocol in the slow set's
tests/test_train_slow.py. The runs share a persistent compilation cache,
so only the first run of each program pays for compilation.
"""
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import tiny
from fkjax import checkpoint as ckpt_lib
from fkjax import data
from fkjax import sparsity
from fkjax.evaluation import run as eval_run
from fkjax.training import build
from fkjax.training import parallel
from fkjax.training import sparsify
from tests.killed import Killed, killed_after
from tests import tiny_run as tiny_run_lib
from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]


def _env(cache_dir, devices=1):
  """The subprocesses' environment; cache_dir None leaves the compilation
  cache to the config (config.compilation_cache_dir). One host device, as
  the shared run had (the device count is part of a compiled program's
  cache key), unless a test needs more."""
  return subprocess_env(cache_dir, devices=devices)


def _cmd(program, workdir, overrides):
  return [sys.executable, program, "--config=configs/tiny.py",
          f"--workdir={workdir}", *overrides]


def _run(program, workdir, overrides, cache_dir, check=True, devices=1):
  proc = subprocess.run(_cmd(program, workdir, overrides), cwd=REPO,
                        env=_env(cache_dir, devices), capture_output=True,
                        text=True, timeout=TIMEOUT_S)
  if check and proc.returncode != 0:
    raise AssertionError(f"{program} failed:\n{proc.stdout}\n{proc.stderr}")
  return proc


ONE_DEVICE = list(tiny_run_lib.ONE_DEVICE)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_run):
  """An uninterrupted 1-device run (a copy of the session's), and the
  compilation cache it filled."""
  root = tmp_path_factory.mktemp("train")
  return {"root": root, "cache": tiny_run_lib.CACHE,
          "full": tiny_run_lib.copy(tiny_run, root / "full"),
          "full_log": tiny_run["log"]}


@pytest.fixture(scope="module")
def runs(full_run):
  """Workdirs: :func:`full_run`'s, and a killed-then-resumed run."""
  root, cache = full_run["root"], full_run["cache"]
  out = dict(full_run)

  # Kill -9 in the middle of epoch 2, once the step-6 checkpoint exists.
  killed = root / "killed"
  proc = subprocess.Popen(_cmd("train.py", killed, ONE_DEVICE), cwd=REPO,
                          env=_env(cache), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  marker = killed / "checkpoints" / "6"
  deadline = time.time() + TIMEOUT_S
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  out["kill_returncode"] = proc.returncode
  # A save that was cut short leaves an orbax temporary directory behind.
  partial = killed / "checkpoints" / "10.orbax-checkpoint-tmp"
  partial.mkdir(parents=True, exist_ok=True)
  (partial / "garbage").write_bytes(b"\x00" * 10)
  out["killed"] = killed
  out["resumed_log"] = _run("train.py", killed, ONE_DEVICE, cache).stdout
  return out


@pytest.fixture(scope="module")
def four_devices(full_run):
  """A 4-device run of the same config (the slow set's)."""
  four = full_run["root"] / "four"
  _run("train.py", four, ["--config.num_devices=4"], full_run["cache"],
       devices=4)
  return four


def _restore(workdir, which="latest", config=None):
  config = config or tiny.get_config()
  exp = build.Experiment.build(config)
  checkpointer = ckpt_lib.Checkpointer(str(workdir), must_exist=True)
  try:
    return exp.restore(checkpointer, which)
  finally:
    checkpointer.close()


def test_progress_in_a_log_file_is_plain_epoch_lines(runs):
  log = runs["full_log"]
  assert "\r" not in log   # no tqdm bar redrawn into the file
  epochs = [l for l in log.splitlines() if l.startswith("epoch ")]
  assert [l.split(" |")[0] for l in epochs] == ["epoch 1", "epoch 2",
                                               "epoch 3"]


def test_the_log_names_the_speed_settings(runs):
  # the CPU's default: auto resolves to NumPy batches
  assert ("training: data pipeline host, precision "
          "float32") in runs["full_log"]


def test_resume_after_kill_matches_uninterrupted_run(runs):
  assert runs["kill_returncode"] == -signal.SIGKILL
  assert "resumed from step" in runs["resumed_log"]
  step_a, full = _restore(runs["full"])
  step_b, resumed = _restore(runs["killed"])
  assert step_a == step_b == 12
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(full),
               jax.device_get(resumed))


def _dp_equivalence(cache, *args):
  proc = subprocess.run(
      [sys.executable, "-m", "tests.dp_equivalence", *args], cwd=REPO,
      env=_env(cache, devices=4), capture_output=True, text=True, timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  for kind in ("natural", "adversarial"):
    assert result[kind]["devices"] == [1, 4], kind
  return result


@pytest.mark.slow   # a 4-device run and 4-device steps, end to end
def test_one_and_four_devices_agree(full_run, four_devices):
  # A step from the same state and batch: equal to float rounding (1e-7
  # measured; momentum and the BatchNorm after the stem amplify it later).
  both = _dp_equivalence(full_run["cache"], "1")
  natural = both["natural"]
  np.testing.assert_allclose(natural["losses_1"], natural["losses_4"],
                             rtol=1e-5)
  assert natural["max_param_diff"] < 1e-5
  # With PGD the rounding differences flip the sign of a few near-zero pixel
  # gradients, so a few pixels of x_adv differ by 2 * step_size: the loss
  # still agrees closely.
  adversarial = both["adversarial"]
  np.testing.assert_allclose(adversarial["losses_1"],
                             adversarial["losses_4"], rtol=1e-5)
  # Whole runs: rounding differences grow (PGD's sign steps, RVSM's hard
  # threshold, BatchNorm right after the stem), but the runs stay together.
  losses = [[json.loads(line)["train_loss"]
             for line in open(w / "metrics.jsonl")]
            for w in (full_run["full"], four_devices)]
  np.testing.assert_allclose(losses[0], losses[1], rtol=2e-2)


def test_epoch_end_projection_makes_params_sparse(runs):
  config = tiny.get_config()
  _, state = _restore(runs["full"])
  threshold = np.sqrt(2 * config.sparsity.lamb / config.sparsity.beta)
  mask = sparsity.conv_kernel_mask(state["params"])
  kernels = [np.asarray(k) for k, m in zip(jax.tree.leaves(state["params"]),
                                           jax.tree.leaves(mask)) if m]
  assert kernels
  for k in kernels:
    # w was replaced by u = H(w): nothing survives at or below the threshold
    assert np.all((k == 0) | (np.abs(k) > threshold))
  records = [json.loads(l) for l in open(runs["full"] / "metrics.jsonl")]
  assert [r["epoch"] for r in records] == [1, 2, 3]
  assert all(r["weight_sparsity"] > 10 for r in records)
  # 4 steps an epoch: a throughput over the 3 after the first is logged
  assert all(r["train_images_per_second"] > 0 for r in records)


@pytest.mark.slow
def test_eval_restores_and_reproduces_train_numbers(runs):
  workdir = runs["full"]
  from_train = json.loads((workdir / "final_eval.json").read_text())
  # No --config: the run's own config.json says what is evaluated.
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={workdir}",
       "--config.num_devices=1", "--config.eval.plots=true",
       "--config.eval.attacks=natural,fgsm"], cwd=REPO,
      env=_env(runs["cache"]), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr
  from_eval = json.loads((workdir / "eval_paper.json").read_text())
  # train.py's own final evaluation is a separate file, left untouched.
  assert json.loads((workdir / "final_eval.json").read_text()) == from_train
  meta = from_eval["metadata"]
  assert meta["config"]["sparsity"]["lamb"] == tiny.get_config().sparsity.lamb
  assert meta["step"] == from_eval["step"] and meta["protocol"] == "paper"
  assert from_eval["attack_settings"]["epsilon"] == meta["config"]["attack"][
      "epsilon"]
  assert from_eval["step"] == from_train["step"]
  for name in ("natural", "fgsm"):
    assert (from_eval["attacks"][name]["accuracy"] ==
            from_train["attacks"][name]["accuracy"])
  assert from_eval["weight_sparsity"] == from_train["weight_sparsity"] > 10
  assert "A1 natural" in proc.stdout
  for png in ("weight_histogram.png", "channel_norms.png", "conv_filters.png"):
    assert (workdir / "plots" / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_export_writes_a_slim_model_with_the_checkpoint_logits(runs,
                                                                tmp_path):
  out = tmp_path / "slim"
  proc = subprocess.run(
      [sys.executable, "export.py", f"--workdir={runs['full']}",
       f"--out={out}", "--config.num_devices=1", "--check_examples=16"],
      cwd=REPO, env=_env(runs["cache"]), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr
  costs = json.loads((out / "costs.json").read_text())
  totals = costs["totals"]
  assert 0 < totals["params_after"] <= totals["params_before"]
  assert 0 < totals["macs_after"] <= totals["macs_before"]
  assert (out / "architecture.json").exists()
  # export.py's own check: the saved model, loaded back, gives the
  # checkpoint's logits under the same noise key.
  check = re.search(r"check on 16 test images \(noise on, same key\): max "
                    r"\|logit difference\| (\S+), same prediction for "
                    r"([\d.]+)%", proc.stdout)
  assert check, proc.stdout
  assert float(check.group(1)) < 1e-4 and float(check.group(2)) == 100.0
  # and a user loading it gets the same function
  from fkjax import slim
  apply_fn, variables = slim.load_slim(str(out))
  config = tiny.get_config()
  config.num_devices = 1
  with ckpt_lib.Checkpointer(str(runs["full"]),
                             must_exist=True) as checkpointer:
    exp = build.Experiment.build(config)
    _, state = exp.restore(checkpointer, config.eval.checkpoint)
  images = data.to_float(exp.dataset.test.images[:8])
  key = jax.random.key(3)
  original = exp.model.apply(sparsify.eval_variables(state, config),
                             images, train=False, rngs={"noise": key})
  np.testing.assert_allclose(apply_fn(variables, images, key), original,
                             atol=1e-4)


@pytest.mark.slow
def test_a_killed_evaluation_resumes_at_its_next_batch(runs, tmp_path,
                                                       monkeypatch, capsys):
  from fkjax.evaluation import journal as eval_journal  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  shutil.copytree(runs["full"], workdir)
  overrides = {"eval.attacks": "natural,fgsm", "eval.batch_size": 8,
               "eval.num_examples": 24, "progress": False}
  config = run_config.config_for_eval(str(workdir), None, overrides, False)
  whole = eval_run.evaluate_checkpoint(config, str(workdir))
  result = workdir / "eval_paper_n24.json"
  expected = json.loads(result.read_text())
  result.unlink()

  real = parallel.eval_batches
  monkeypatch.setattr(parallel, "eval_batches",
                      lambda *a, **k: killed_after(real(*a, **k), 2))
  with pytest.raises(Killed):
    eval_run.evaluate_checkpoint(config, str(workdir))
  assert not result.exists()
  assert len(list((workdir / eval_journal.JOURNAL_DIR).iterdir())) == 1
  assert eval_journal.batches_kept(str(workdir)) == 2
  monkeypatch.setattr(parallel, "eval_batches", real)
  capsys.readouterr()
  resumed = eval_run.evaluate_checkpoint(config, str(workdir))
  assert "batches done by an earlier attempt (main: 2)" in (
      capsys.readouterr().out)
  assert json.loads(result.read_text())["correct_per_image"] == (
      expected["correct_per_image"])
  for name in ("natural", "fgsm"):
    assert resumed["attacks"][name]["accuracy"] == (
        whole["attacks"][name]["accuracy"])
  assert not (workdir / eval_journal.JOURNAL_DIR).exists()


@pytest.mark.slow
def test_rerunning_a_finished_run_keeps_other_results(runs, tmp_path):
  workdir = tmp_path / "finished"
  shutil.copytree(runs["full"], workdir)
  marker = {"attacks": {"nattack": {"accuracy": 12.5}}, "hours": 9}
  (workdir / "eval_paper.json").write_text(json.dumps(marker))
  proc = _run("train.py", workdir, ONE_DEVICE, runs["cache"])
  assert "resumed from step 12" in proc.stdout
  assert json.loads((workdir / "eval_paper.json").read_text()) == marker
  assert (workdir / "final_eval.json").exists()


@pytest.mark.slow
def test_a_second_writer_is_refused_in_one_line(runs, tmp_path):
  workdir = tmp_path / "busy"
  first = subprocess.Popen(_cmd("train.py", workdir, ONE_DEVICE), cwd=REPO,
                           env=_env(runs["cache"]), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + TIMEOUT_S
    while (not (workdir / "config.json").exists() and first.poll() is None
           and time.time() < deadline):
      time.sleep(0.05)
    assert first.poll() is None, "the first run ended too early"
    second = _run("train.py", workdir, ONE_DEVICE, runs["cache"], check=False)
  finally:
    first.kill()
    first.wait()
  assert second.returncode == 1
  assert second.stderr.startswith("error: ") and "in use by process" in (
      second.stderr), second.stderr
  assert len(second.stderr.strip().splitlines()) == 1


def test_cli_overrides_are_recorded_and_bad_keys_rejected(runs, tmp_path):
  config = json.loads((runs["full"] / "config.json").read_text())
  assert config["training"]["checkpoint_every_steps"] == 2
  assert config["num_devices"] == 1
  assert config["sparsity"]["method"] == "rvsm"
  proc = _run("train.py", tmp_path / "bad", ["--config.sparsity.lambda=1"],
              runs["cache"], check=False)
  assert proc.returncode != 0
  assert "lambda" in proc.stderr
  assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.slow
def test_cli_keeps_compiled_steps_in_the_configured_cache(runs, tmp_path):
  cache = tmp_path / "compiled"
  workdir = tmp_path / "copy"
  shutil.copytree(runs["full"], workdir)
  _run("eval.py", workdir, [f"--config.compilation_cache_dir={cache}",
                             "--config.eval.attacks=natural",
                             "--config.eval.plots=False"], cache_dir=None)
  assert any(cache.iterdir())


@pytest.mark.slow
def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(runs, tmp_path):
  workdir = tmp_path / "nan"
  # lr jumps from 0.1 to 1e29 after epoch 1: the loss blows up in epoch 2.
  proc = _run("train.py", workdir,
              ["--config.num_devices=1", "--config.training.lr_decay=1e30",
               "--config.training.lr_boundaries=(1,)"], runs["cache"],
              check=False)
  assert proc.returncode != 0
  assert "training diverged" in proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  step, state = _restore(workdir)
  assert step == 4
  assert all(np.all(np.isfinite(x)) for x in
             jax.tree.leaves(jax.device_get(state["params"])))


@pytest.mark.slow
def test_a_run_diverging_in_its_first_step_saves_nothing(runs, tmp_path):
  # One step an epoch, lr 1e6: the step's own loss (taken before its
  # update) is fine; the weights it leaves are not, and are never saved.
  workdir = tmp_path / "diverged"
  proc = _run("train.py", workdir,
              ["--config.num_devices=1", "--config.training.batch_size=64",
               "--config.validation.batch_size=32",
               "--config.training.learning_rate=1e6"], runs["cache"],
              check=False)
  assert proc.returncode == 1
  assert "training diverged" in proc.stderr, proc.stderr
  assert "no checkpoint was written" in proc.stderr
  assert not ckpt_lib.has_checkpoints(str(workdir))


def test_eval_errors_are_clear(runs, tmp_path):
  config = tiny.get_config()
  config.num_devices = 1
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoints"):
    eval_run.evaluate_checkpoint(config, str(tmp_path / "nowhere"))

  wrong = tiny.get_config()
  wrong.model.width = 2
  with pytest.raises(ckpt_lib.CheckpointError, match="config"):
    _restore(runs["full"], "best", config=wrong)

  corrupt = tmp_path / "corrupt"
  shutil.copytree(runs["full"], corrupt)
  for path in (corrupt / "checkpoints").rglob("*"):
    if path.is_file() and path.stat().st_size > 1000:
      path.write_bytes(path.read_bytes()[:100])
  # The digests' file is cut short too: the checkpoint cannot be verified.
  with pytest.raises(ckpt_lib.CheckpointError,
                     match="could not restore|is corrupt|cannot be verified"):
    _restore(corrupt, "best")


@pytest.mark.slow
def test_admm_results_report_both_readings(full_run, tmp_path):
  workdir = tmp_path / "admm"
  runs = full_run   # its compilation cache holds the same model's programs
  trained = subprocess.run(
      [sys.executable, "train.py", "--config=configs/tiny.py:admm",
       f"--workdir={workdir}", "--config.num_devices=1",
       "--config.training.num_epochs=1", "--config.eval.final_attacks="],
      cwd=REPO, env=_env(runs["cache"]), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  assert trained.returncode == 0, trained.stderr
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={workdir}",
       "--config.eval.attacks=natural", "--config.eval.plots=false"],
      cwd=REPO, env=_env(runs["cache"]), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr
  result = json.loads((workdir / "eval_paper.json").read_text())
  percent = tiny.get_config("admm").sparsity.percent
  # u: exactly the target share of zeros; w: dense during training
  assert result["weight_sparsity"] == pytest.approx(percent, abs=1.0)
  dense = result["admm_dense_w"]
  assert dense["weight_sparsity"] < 1.0
  assert 0.0 <= dense["attacks"]["natural"]["accuracy"] <= 100.0
  assert result["near_zero"]["weights_below_1e-3"] >= percent - 1.0
  assert "ADMM, the dense w" in proc.stdout
