"""Tests for fkjax.eval_result: the typed result and its file form."""
import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

from fkjax import eval_loop
from fkjax import workdir as workdir_lib
from fkjax.eval_result import AttackResult
from fkjax.eval_result import EvalResult

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
