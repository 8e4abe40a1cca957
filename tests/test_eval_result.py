"""Tests for fkjax.evaluation.result: the typed result and its file form."""
import dataclasses
import json
import math
import pathlib

import jax
import numpy as np
import pytest

from fkjax.evaluation import loop as eval_loop
from fkjax.evaluation import strong as eval_strong
from fkjax.evaluation import tables as eval_tables
from fkjax import workdir as workdir_lib
from fkjax.evaluation.result import AttackResult
from fkjax.evaluation.result import EvalResult
from fkjax.evaluation.strong_result import Spread
from fkjax.evaluation.strong_result import StrongResult
from fkjax.evaluation.strong_result import StrongSettings

REPO = pathlib.Path(__file__).resolve().parents[1]


def _committed_paper_results():
  """The committed paper-protocol result files (the strong protocol's have
  their own form)."""
  paths = sorted(REPO.glob("results/**/eval_*.json")) + sorted(
      REPO.glob("results/**/final_eval.json"))
  files = [(p, json.loads(p.read_text())) for p in paths]
  return [(p, d) for p, d in files if "settings" not in d]


def test_committed_result_files_are_written_again_byte_for_byte(tmp_path):
  # The files written since resumed_seconds exists: reading one and writing
  # it again the way eval_run does (the evaluation's to_json, then the
  # record beside it) gives the same bytes, key order and numbers included.
  current = [(p, d) for p, d in _committed_paper_results()
             if "resumed_seconds" in d]
  assert len(current) >= 10
  for path, document in current:
    result = EvalResult.from_json(document)
    own = result.to_json()
    record = {k: v for k, v in document.items()
              if k not in own and k != "metadata"}
    out = tmp_path / path.name
    workdir_lib.write_results(out, {**own, **record}, document["metadata"])
    assert out.read_bytes() == path.read_bytes(), path
    if "correct_per_image" in document:
      for name, right in result.per_image.items():
        assert right.shape == (document["num_examples"],)
        assert int(right.sum()) == document["attacks"][name]["correct"]


def test_older_result_files_still_load():
  older = [d for _, d in _committed_paper_results()
           if "resumed_seconds" not in d]
  assert older
  without_vectors = [d for d in older if "correct_per_image" not in d]
  assert without_vectors
  for document in older:
    result = EvalResult.from_json(document)
    assert result.resumed_seconds == 0.0
    assert result.names == list(document["attacks"])
    assert result.accuracies() == {
        k: v["accuracy"] for k, v in document["attacks"].items()}
  assert EvalResult.from_json(without_vectors[0]).per_image is None


def _tally_result(per_image):
  tally = eval_loop.Tally.resume(["natural", "fgsm"], per_image, None)
  tally.add_batch({"natural": (np.array([True, True, False]), 1.5),
                   "fgsm": (np.array([True, False, False]), 2.0)})
  tally.compile_seconds.update({"natural": 0.25, "fgsm": 0.5})
  return tally.result(1, {"natural": 1, "fgsm": 1})


def test_an_evaluation_s_result_by_attribute_and_back_from_its_json():
  result = _tally_result(per_image=True)
  assert result.names == ["natural", "fgsm"]
  assert result.accuracy("natural") == pytest.approx(200 / 3)
  assert result.attacks["fgsm"] == AttackResult(
      accuracy=100 / 3, correct=1, seconds=2.0, compile_seconds=0.5,
      num_compiles=1)
  document = result.to_json()
  assert list(document) == [
      "num_examples", "num_noise_draws", "attacks",
      "predict_compile_seconds", "resumed_seconds", "correct_per_image",
      "correct_per_image_encoding"]
  assert document["attacks"]["natural"] == {
      "accuracy": 200 / 3, "correct": 2, "seconds": 1.5,
      "compile_seconds": 0.25, "num_compiles": 1}
  assert document["correct_per_image_encoding"] == (
      workdir_lib.CORRECT_ENCODING)
  back = EvalResult.from_json(json.loads(json.dumps(document)))
  assert back == result
  np.testing.assert_array_equal(back.per_image["fgsm"],
                                [True, False, False])
  assert back != _tally_result(per_image=False)
  assert "correct_per_image" not in _tally_result(per_image=False).to_json()
  with pytest.raises(dataclasses.FrozenInstanceError):
    result.num_examples = 4


def test_no_image_reads_back_as_nan(tmp_path):
  empty = eval_loop.Tally.resume(["natural"], False, None).result(
      1, {"natural": 0})
  path = tmp_path / "empty.json"
  workdir_lib.write_results(path, empty.to_json(), {})
  document = json.loads(path.read_text())
  assert document["attacks"]["natural"]["accuracy"] is None   # JSON: no NaN
  back = EvalResult.from_json(document)
  assert math.isnan(back.accuracy("natural"))
  assert back == empty


# --- the strong protocol's result ---------------------------------------------


def test_committed_strong_results_are_written_again_byte_for_byte(tmp_path):
  # Read, then written again the way eval_run writes eval_strong.json (the
  # result's to_json, then the step and sparsity beside it): the same bytes,
  # files written before a key existed included.
  paths = sorted(REPO.glob("results/**/eval_strong*.json"))
  assert len(paths) >= 16
  for path in paths:
    document = json.loads(path.read_text())
    result = StrongResult.from_json(document)
    own = result.to_json()
    record = {k: v for k, v in document.items()
              if k not in own and k != "metadata"}
    assert list(record) == ["step", "weight_sparsity", "channel_sparsity"]
    out = tmp_path / path.name
    workdir_lib.write_results(out, {**own, **record}, document["metadata"])
    assert out.read_bytes() == path.read_bytes(), path
    worst = result.worst_case
    assert worst.accuracy == document["worst_case"]["accuracy"]
    assert worst.each_seed.per_seed == tuple(
        document["worst_case"]["per_seed"])
    for name, entry in result.attacks.items():
      assert entry.accuracy.mean == document["attacks"][name]["accuracy"]
      assert int(result.per_image[name].sum()) == entry.correct


def _seed_run(natural, apgd_ce):
  tally = eval_loop.Tally.resume(["natural", "apgd_ce"], True, None)
  tally.add_batch({"natural": (np.array(natural, bool), 1.5),
                   "apgd_ce": (np.array(apgd_ce, bool), 2.0)})
  tally.compile_seconds.update({"natural": 0.25, "apgd_ce": 0.5})
  return tally.result(1, {"natural": 1, "apgd_ce": 1})


class _SeedRuns:
  """A stand-in ``Evaluator``: its given results, one per call (seed)."""
  names = ["natural", "apgd_ce"]

  def __init__(self, runs):
    self._runs = iter(runs)

  def __call__(self, variables, batches, key, **unused):
    return next(self._runs)


def _strong_result():
  seeds = eval_strong.repeat_evaluation(
      _SeedRuns([_seed_run([1, 1, 1, 0], [1, 1, 0, 0]),
                 _seed_run([1, 1, 1, 0], [0, 1, 1, 0])]),
      None, [], jax.random.key(0), num_seeds=2)
  settings = StrongSettings(
      epsilon=8 / 255, stochastic=True, eot_samples=20, check_draws=3,
      num_noise_draws=1, num_iters=100, n_restarts=1, targeted=False,
      num_targets=0, num_seeds=2, targeted_on_survivors=False)
  return StrongResult(
      **{f.name: getattr(seeds, f.name) for f in dataclasses.fields(seeds)},
      description=eval_strong.describe(settings, ["natural", "apgd_ce"]),
      settings=settings, seconds=9.5)


def test_a_strong_result_by_attribute_and_back_from_its_json():
  result = _strong_result()
  apgd_ce = result.attacks["apgd_ce"]
  assert apgd_ce.accuracy == Spread(mean=50.0, std=0.0, per_seed=(50.0, 50.0))
  assert (apgd_ce.correct, apgd_ce.seconds, apgd_ce.compile_seconds) == (2, 4.0, 1.0)
  worst = result.worst_case
  # Image 0 falls under seed 1, image 2 under seed 0: only image 1 holds.
  np.testing.assert_array_equal(worst.robust, [False, True, False, False])
  assert (worst.accuracy, worst.correct, worst.num_seeds) == (25.0, 1, 2)
  assert worst.each_seed.per_seed == (50.0, 50.0)
  document = result.to_json()
  assert list(document) == [
      "protocol", "description", "settings", "num_seeds", "num_examples",
      "num_noise_draws", "attacks", "per_image", "predict_compile_seconds",
      "resumed_seconds", "worst_case", "seconds"]
  assert list(document["worst_case"]) == [
      "accuracy", "correct", "num_examples", "attacks", "num_seeds",
      "correct_per_image", "per_seed", "mean_over_seeds", "std"]
  assert document["settings"]["targeted_on_survivors"] is False
  assert document["attacks"]["apgd_ce"] == {
      "accuracy": 50.0, "std": 0.0, "per_seed": [50.0, 50.0], "correct": 2,
      "seconds": 4.0, "compile_seconds": 1.0, "num_compiles": 1}
  back = StrongResult.from_json(json.loads(json.dumps(document)))
  assert back == result
  assert back.worst_case == worst
  assert eval_tables.format_strong(back) == eval_tables.format_strong(result)
  assert "25.00 (every attack, every seed: 1/4 images)" in (
      eval_tables.format_strong(result))
  with pytest.raises(dataclasses.FrozenInstanceError):
    result.seconds = 1.0
  with pytest.raises(ValueError, match="not a strong protocol"):
    StrongResult.from_json({**document, "protocol": "paper"})
