"""The slow set's end-to-end runs of train.py / eval.py (``-m slow``; CI
runs them, the README's quick command does not): a jax.distributed run of
two processes, and eval.py's strong protocol, both from one uninterrupted
1-device run of the tiny config, made here as tests/test_train.py makes its
own; and a run over 8 devices with the default batch sizes.
"""
import json
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests import tiny_run as tiny_run_lib
from tests.subprocess_env import subprocess_env

from tests.test_train import REPO
from tests.test_train import _cmd
from tests.test_train import _env
from tests.subprocess_env import TIMEOUT_S

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_run):
  """An uninterrupted 1-device run (a copy of the session's, as
  tests/test_train.py's ``full``)."""
  root = tmp_path_factory.mktemp("train_slow")
  return {"root": root, "cache": tiny_run_lib.CACHE,
          "full": tiny_run_lib.copy(tiny_run, root / "full")}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_process_run_on_localhost_matches_one_device(runs):
  """jax.distributed on CPU: 2 processes, each with 1 device, one workdir."""
  workdir = runs["root"] / "two_process"
  address = f"127.0.0.1:{_free_port()}"
  env = _env(runs["cache"])
  env.pop("XLA_FLAGS")   # one CPU device per process
  procs = [subprocess.Popen(
      _cmd("train.py", workdir, [f"--coordinator_address={address}",
                                 "--num_processes=2", f"--process_id={i}",
                                 "--config.eval.final_attacks="]),
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  outputs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  assert "devices: 2 x cpu" in outputs[0][0]
  losses = [[json.loads(line)["train_loss"]
             for line in open(w / "metrics.jsonl")]
            for w in (runs["full"], workdir)]
  np.testing.assert_allclose(losses[0], losses[1], rtol=2e-2)
  assert (workdir / "checkpoints" / "12").is_dir()




def test_eval_strong_protocol_writes_its_own_results(runs, tmp_path):
  workdir = tmp_path / "strong"
  shutil.copytree(runs["full"], workdir)
  paper = workdir / "eval_paper.json"
  paper.write_text('{"kept": true}')
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={workdir}",
       "--config.num_devices=1", "--config.eval.protocol=strong",
       "--config.eval.strong.num_iters=3", "--config.eval.strong.num_seeds=2",
       "--config.eval.strong.eot_samples=2",
       "--config.eval.strong.num_targets=2",
       "--config.eval.strong.sanity_examples=0"], cwd=REPO,
      env=_env(runs["cache"]), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr
  result = json.loads((workdir / "eval_strong.json").read_text())
  assert paper.read_text() == '{"kept": true}'   # the other protocol's
  assert result["protocol"] == "strong"
  assert result["metadata"]["protocol"] == "strong"
  assert result["settings"]["eot_samples"] == 2   # a noisy model
  attacks_ = result["attacks"]
  assert {"natural", "apgd_ce", "apgd_dlr"} <= set(attacks_)
  worst = result["worst_case"]
  assert len(worst["per_seed"]) == 2
  for seed, acc in enumerate(worst["per_seed"]):
    assert acc <= min(attacks_[a]["per_seed"][seed] for a in attacks_)
  assert "worst case" in proc.stdout


# The default batch sizes (training 128, validation and evaluation 500) on
# synthetic data where neither the validation split (30) nor the test set
# (60) divides over 8 devices; two training steps of 128.
EIGHT_DEVICES = [
    "--config.training.batch_size=128", "--config.validation.batch_size=500",
    "--config.eval.batch_size=500", "--config.dataset.synthetic_sizes=(286,60)",
    "--config.dataset.val_size=30", "--config.training.num_epochs=1"]
# eval.py's protocols at small budgets; NAttack's image groups (16) and
# population chunks split the batch unevenly too.
PAPER_ATTACKS = [
    "--config.eval.attacks=natural,fgsm,ifgsm20,cw,nattack",
    "--config.eval.nattack_population=8", "--config.eval.nattack_iters=2",
    "--config.eval.nattack_chunk=4", "--config.eval.nattack_image_chunk=16"]
STRONG = [
    "--config.eval.protocol=strong", "--config.eval.strong.num_iters=2",
    "--config.eval.strong.num_seeds=1", "--config.eval.strong.num_targets=1",
    "--config.eval.strong.eot_samples=1",
    "--config.eval.strong.sanity_examples=0"]


def test_a_run_on_eight_devices_runs_to_its_end(tmp_path):
  """train.py then eval.py (paper with NAttack, and strong) on 8 devices
  with the default batch sizes: nothing refused, nothing lost."""
  workdir = tmp_path / "eight"
  env = subprocess_env(tmp_path / "cache", devices=8)

  def run(program, *args):
    proc = subprocess.run(
        [sys.executable, program, f"--workdir={workdir}", *args], cwd=REPO,
        env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout

  assert "devices: 8 x cpu" in run("train.py", "--config=configs/tiny.py",
                                   *EIGHT_DEVICES)
  records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert "val_natural_accuracy" in records[-1]
  final = json.loads((workdir / "final_eval.json").read_text())
  assert final["num_examples"] == 60
  # The final evaluation's attacks again on one device, into their own
  # file: image for image the same results.
  run("eval.py", "--config.num_devices=1", "--config.eval.protocol=one",
      "--config.eval.attacks=natural,fgsm")
  one = json.loads((workdir / "eval_one.json").read_text())
  assert one["metadata"]["devices"].startswith("1 x cpu")
  assert final["metadata"]["devices"].startswith("8 x cpu")
  assert one["correct_per_image"] == final["correct_per_image"]
  run("eval.py", *PAPER_ATTACKS)
  paper = json.loads((workdir / "eval_paper.json").read_text())
  assert paper["num_examples"] == 60
  assert set(paper["attacks"]) == {"natural", "fgsm", "ifgsm20", "cw",
                                   "nattack"}
  run("eval.py", *STRONG)
  strong = json.loads((workdir / "eval_strong.json").read_text())
  assert strong["protocol"] == "strong"
  assert {"natural", "apgd_ce", "apgd_dlr"} <= set(strong["attacks"])
