"""No result is thrown away without a word: eval.py merges into an earlier
result file, export.py never deletes what it did not write, a run whose
record is missing resumes only where its checkpoint agrees.

One tiny synthetic run is trained once (a real ``python train.py``); each
test works on a copy of it.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fkjax.evaluation import merge as eval_merge
from fkjax import workdir as workdir_lib
from tests import tiny_run as tiny_run_lib
from tests.subprocess_env import FILE_SIZE_LIMIT
from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
ONE_DEVICE = tiny_run_lib.ONE_DEVICE
# eval.py on 16 images, quietly.
SMALL_EVAL = ["--config.eval.num_examples=16", "--config.progress=false"]


def _run(args, cache, check=True):
  proc = subprocess.run([sys.executable, *args], cwd=REPO,
                        env=subprocess_env(cache), capture_output=True,
                        text=True, timeout=TIMEOUT_S)
  if check and proc.returncode != 0:
    raise AssertionError(f"{args} failed:\n{proc.stdout}\n{proc.stderr}")
  return proc


@pytest.fixture(scope="module")
def trained(tiny_run):
  """The session's finished tiny run (copied before a test writes to it),
  and the compilation cache it filled."""
  return tiny_run["workdir"], tiny_run_lib.CACHE


def _copy(trained, tmp_path, name="run"):
  workdir = tmp_path / name
  shutil.copytree(trained[0], workdir)
  return workdir


def _eval(workdir, cache, attacks, *extra):
  return _run(["eval.py", f"--workdir={workdir}",
               f"--config.eval.attacks={attacks}", *SMALL_EVAL, *extra],
              cache)


# --------------------------------------------------------------------------
# eval.py merges.


@pytest.mark.slow
def test_a_run_of_fewer_attacks_keeps_the_others(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  (workdir / workdir_lib.LOCK_NAME).unlink()   # the one train.py left
  _eval(workdir, trained[1], "natural,fgsm")
  path = workdir / "eval_paper_n16.json"
  first = json.loads(path.read_text())
  proc = _eval(workdir, trained[1], "natural")
  assert "eval_paper_n16.json: kept the earlier results of fgsm (of " in (
      proc.stdout)
  merged = json.loads(path.read_text())
  assert list(merged["attacks"]) == ["natural", "fgsm"]
  # The kept entry as measured, saying which run made it.
  assert merged["attacks"]["fgsm"] == first["attacks"]["fgsm"]
  assert merged["attacks"]["fgsm"]["produced"]["attacks_evaluated"] == (
      "natural,fgsm")
  assert merged["attacks"]["natural"]["produced"]["attacks_evaluated"] == (
      "natural")
  assert merged["correct_per_image"]["fgsm"] == (
      first["correct_per_image"]["fgsm"])
  assert merged["metadata"]["date"] >= first["metadata"]["date"]
  # eval.py leaves no lock file behind.
  assert not (workdir / workdir_lib.LOCK_NAME).exists()
  # Other settings: the earlier file is kept whole in the new one's
  # "earlier" list (nothing deleted), and the output says so.
  proc = _eval(workdir, trained[1], "natural",
               "--config.eval.num_noise_draws=2")
  assert ("fgsm (of " in proc.stdout
          and "kept in the file's 'earlier' list" in proc.stdout
          and "config.eval.num_noise_draws 1, now 2" in proc.stdout)
  now = json.loads(path.read_text())
  assert list(now["attacks"]) == ["natural"]
  assert now["earlier"][0]["attacks"] == merged["attacks"]
  assert now["earlier"][0]["metadata"] == merged["metadata"]


@pytest.mark.slow
def test_overlapping_evaluations_merge(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  cache = trained[1]
  procs = [subprocess.Popen(
      [sys.executable, "eval.py", f"--workdir={workdir}",
       f"--config.eval.attacks={attacks}", *SMALL_EVAL], cwd=REPO,
      env=subprocess_env(cache), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
           for attacks in ("natural,fgsm", "natural,ifgsm20")]
  for proc in procs:
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, out + err
  merged = json.loads((workdir / "eval_paper_n16.json").read_text())
  assert set(merged["attacks"]) == {"natural", "fgsm", "ifgsm20"}
  assert set(merged["correct_per_image"]) == {"natural", "fgsm", "ifgsm20"}


def _file(attacks, date, **config):
  return {"attacks": {name: {"accuracy": 50.0, "correct": 8}
                      for name in attacks},
          "correct_per_image": {name: "x" for name in attacks},
          "num_examples": 16,
          "metadata": {"date": date, "git_commit": "abc", "step": 12,
                       "checkpoint": "best", "data": "d", "protocol": "paper",
                       "config": {"eval": {"attacks": ",".join(attacks),
                                           "num_noise_draws": 1},
                                  "progress": True, **config}}}


def test_merge_keeps_only_what_the_same_settings_made():
  old = _file(["natural", "fgsm", "cw"], "2026-01-01T00:00:00Z")
  new = _file(["natural"], "2026-01-02T00:00:00Z", seed=0)
  metadata = new.pop("metadata")
  metadata["config"]["progress"] = False   # cannot change a number
  old["metadata"]["config"]["seed"] = 0
  document, remark = eval_merge.merge(old, new, metadata)
  assert list(document["attacks"]) == ["natural", "fgsm", "cw"]
  assert document["attacks"]["cw"]["produced"] == {
      "date": "2026-01-01T00:00:00Z", "git_commit": "abc",
      "attacks_evaluated": "natural,fgsm,cw"}
  assert document["attacks"]["natural"]["produced"]["date"] == (
      "2026-01-02T00:00:00Z")
  assert remark.startswith("kept the earlier results of fgsm (of "
                           "2026-01-01T00:00:00Z), cw (of ")
  # Another step, another seed: not merged, kept whole beside, and said.
  for key, value in (("step", 13), ("config", {"seed": 1})):
    other = json.loads(json.dumps(metadata))
    if key == "config":
      other["config"].update(value)
    else:
      other[key] = value
    document, remark = eval_merge.merge(old, new, other)
    assert list(document["attacks"]) == ["natural"]
    assert [list(e["attacks"]) for e in document["earlier"]] == [
        ["natural", "fgsm", "cw"]]
    assert "kept in the file's 'earlier' list" in remark and (
        "step 12, now 13" in remark or "config.seed 0, now 1" in remark)
  # A file that does not say how it was made is not merged into.
  document, remark = eval_merge.merge(
      {"attacks": {"cw": {"accuracy": 1.0}}}, new, metadata)
  assert list(document["attacks"]) == ["natural"]
  assert document["earlier"][0]["attacks"]["cw"]["accuracy"] == 1.0
  assert remark == ("the earlier results of cw were made under another "
                    "checkpoint or settings (the earlier file does not "
                    "record its config): kept in the file's 'earlier' list; "
                    "its top level shows this evaluation's")
  # No earlier file, or one of the same attacks: nothing to say.
  assert eval_merge.merge(None, new, metadata)[1] is None
  assert eval_merge.merge(_file(["natural"], "2026-01-01T00:00:00Z"), new,
                          metadata)[1] is None


# --------------------------------------------------------------------------
# export.py never deletes what it did not write.


def _export(workdir, out, cache, check=True):
  return _run(["export.py", f"--workdir={workdir}", f"--out={out}",
               "--check_examples=4"], cache, check=check)


def _one_line(proc, *fragments):
  assert proc.returncode == 1, proc.stdout + proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


@pytest.mark.slow
def test_export_replaces_only_its_own_files(trained, tmp_path):
  workdir, cache = trained
  # A folder of the user's: refused before any work, kept as it was.
  mine = tmp_path / "mine"
  (mine / "variables").mkdir(parents=True)
  (mine / "variables" / "keep.npz").write_bytes(b"user")
  _one_line(_export(workdir, mine, cache, check=False), f"--out={mine}",
            "no export of fkjax", "choose a new or empty folder")
  assert (mine / "variables" / "keep.npz").read_bytes() == b"user"
  # An earlier export: replaced in its own files, the user's notes stay.
  out = tmp_path / "slim"
  _export(workdir, out, cache)
  first = sorted(p.name for p in (out / "variables").iterdir())
  (out / "notes.txt").write_text("mine")
  _export(workdir, out, cache)
  assert (out / "notes.txt").read_text() == "mine"
  assert sorted(p.name for p in (out / "variables").iterdir()) == first
  assert sorted(p.name for p in out.iterdir()) == [
      "architecture.json", "costs.json", "notes.txt", "variables"]
  # A file of the user's inside an export's variables/: refused, kept.
  (out / "variables" / "keep.npz").write_bytes(b"user")
  _one_line(_export(workdir, out, cache, check=False),
            f"{out / 'variables'} holds files export.py did not write "
            "(keep.npz)")
  assert (out / "variables" / "keep.npz").read_bytes() == b"user"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "slim"]


# --------------------------------------------------------------------------
# A run whose config.json is missing resumes only where its checkpoint agrees.


def _train(workdir, cache, *extra, check=True):
  return _run(["train.py", "--config=configs/tiny.py", f"--workdir={workdir}",
               *ONE_DEVICE, *extra], cache, check=check)


@pytest.mark.slow
def test_a_run_without_its_record_resumes_only_as_its_checkpoint_says(
    trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  cache = trained[1]
  (workdir / "config.json").unlink()
  steps = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  # Another batch size continued the old one's checkpoint, and claimed the
  # new one in a new config.json.
  _one_line(_train(workdir, cache, "--config.training.batch_size=32",
                   check=False),
            "config.json is missing", "its checkpoint step 12 was trained "
            "with another config", "config.training.batch_size: checkpoint "
            "16, now 32")
  assert not (workdir / "config.json").exists()
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == steps
  # The run's own config resumes it, and records it again.
  proc = _train(workdir, cache)
  assert "resumed from step 12" in proc.stdout
  assert json.loads((workdir / "config.json").read_text())["training"][
      "batch_size"] == 16


def test_checkpoints_that_record_no_config_need_the_record(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  (workdir / "config.json").unlink()
  for metadata in (workdir / "checkpoints").glob("*/_CHECKPOINT_METADATA"):
    document = json.loads(metadata.read_text())
    del document["custom_metadata"]["fkjax"]["run_config"]
    metadata.write_text(json.dumps(document))
  _one_line(_train(workdir, trained[1], check=False),
            "config.json is missing", "do not record the config",
            "restore config.json")


# --------------------------------------------------------------------------
# What train.py and eval.py leave to look at.


def test_the_curves_and_the_test_accuracies_are_there_to_see(trained,
                                                             tmp_path):
  from tests.test_metric_logging import _events, _scalars  # pylint: disable=C0415
  workdir = _copy(trained, tmp_path)
  png = workdir / "plots" / "training_curves.png"
  assert png.read_bytes()[:4] == b"\x89PNG"
  _eval(workdir, trained[1], "natural,fgsm")
  scalars = {}
  for events in _events(workdir / "tensorboard"):
    scalars.update(_scalars(events))
  final = json.loads((workdir / "final_eval.json").read_text())
  evaluated = json.loads((workdir / "eval_paper_n16.json").read_text())
  for stem, document in (("final_eval", final),
                         ("eval_paper_n16", evaluated)):
    for name, entry in document["attacks"].items():
      assert scalars[(document["step"], f"{stem}/{name}_accuracy")] == (
          pytest.approx(entry["accuracy"]))
  # The training scalars of every epoch are still there.
  assert {step for step, tag in scalars if tag == "train_loss"} == {4, 8, 12}


def test_an_export_that_cannot_be_written_is_one_line(trained, tmp_path):
  # Files above 64 KiB fail (EFBIG), as on a full disk: orbax's tracebacks.
  out = tmp_path / "slim"
  proc = _run(["-c", FILE_SIZE_LIMIT, "export.py",
               f"--workdir={trained[0]}", f"--out={out}",
               "--config.compilation_cache_dir="], None, check=False)
  _one_line(proc, f"could not write the export to {out}: File too large",
            "is unchanged")
  assert not list(tmp_path.iterdir())
