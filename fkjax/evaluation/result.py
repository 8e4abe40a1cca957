"""An evaluation's result: per attack its accuracy and costs, typed.

``fkjax.evaluation.loop.Evaluator`` and ``robust_accuracy`` return an
``EvalResult``: one ``AttackResult`` per attack, in the suite's order, and,
when asked for, which images each attack left classified right
(``per_image``). ``to_json`` gives the dict the result files hold (the
evaluation's part of ``eval_paper.json``, ``final_eval.json``, ...), key for
key as written since the files have existed; ``from_json`` reads one back.
The strong protocol's result, over seeds, is ``fkjax.evaluation.strong_result``'s.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from fkjax.workdir import per_image as per_image_lib


@dataclasses.dataclass(frozen=True)
class AttackResult:
  """What one attack of an evaluation measured.

  Attributes:
    accuracy: % of the images still classified right after the attack (NaN
      for no image).
    correct: how many images that is.
    seconds: wall time of the attack and its prediction, compilation
      included (of every attempt, for an evaluation resumed from a journal).
    compile_seconds: the part of ``seconds`` spent compiling.
    num_compiles: programs compiled for it (one per batch shape).
  """
  accuracy: float
  correct: int
  seconds: float
  compile_seconds: float
  num_compiles: int

  def to_json(self) -> dict[str, Any]:
    """The attack's entry of a result file's ``"attacks"``."""
    # The values as counted, not cast: an int 0 stays 0 in the file.
    return {"accuracy": self.accuracy, "correct": self.correct,
            "seconds": self.seconds, "compile_seconds": self.compile_seconds,
            "num_compiles": self.num_compiles}

  @classmethod
  def from_json(cls, entry: Mapping[str, Any]) -> "AttackResult":
    """The attack's entry as ``to_json`` wrote it (a NaN accuracy is
    written as null)."""
    accuracy = entry["accuracy"]
    return cls(accuracy=math.nan if accuracy is None else accuracy,
               correct=entry["correct"], seconds=entry["seconds"],
               compile_seconds=entry["compile_seconds"],
               num_compiles=entry["num_compiles"])


@dataclasses.dataclass(frozen=True, eq=False)
class EvalResult:
  """Accuracy under each attack of a suite, over a dataset.

  Attributes:
    num_examples: the real (non-padding) images evaluated.
    num_noise_draws: noise draws the prediction that scores an adversarial
      image averages over.
    attacks: attack name -> its ``AttackResult``, in the suite's order.
    predict_compile_seconds: seconds spent compiling the prediction.
    resumed_seconds: of the attacks' seconds, those an earlier attempt (a
      journal) spent; 0 without one.
    per_image: with ``per_image=True``, attack name -> bool array
      ``[num_examples]`` (True: still classified right), in data order;
      None otherwise.

  Two results are equal when their ``to_json()`` are.
  """
  num_examples: int
  num_noise_draws: int
  attacks: Mapping[str, AttackResult]
  predict_compile_seconds: float
  resumed_seconds: float = 0.0
  per_image: Mapping[str, np.ndarray] | None = None

  @property
  def names(self) -> list[str]:
    """The attacks' names, in the suite's order."""
    return list(self.attacks)

  def accuracy(self, name: str) -> float:
    """Accuracy (%) under attack ``name``."""
    return self.attacks[name].accuracy

  def accuracies(self) -> dict[str, float]:
    """Attack name -> accuracy (%), in the suite's order."""
    return {name: entry.accuracy for name, entry in self.attacks.items()}

  def to_json(self) -> dict[str, Any]:
    """The dict a result file holds for this evaluation.

    Keys in the order the files have always had, values as counted;
    ``per_image`` is written as ``correct_per_image``
    (``fkjax.workdir.encode_correct`` per attack) with its
    ``correct_per_image_encoding``.
    """
    out: dict[str, Any] = {
        "num_examples": self.num_examples,
        "num_noise_draws": self.num_noise_draws,
        "attacks": {name: entry.to_json()
                    for name, entry in self.attacks.items()},
        "predict_compile_seconds": self.predict_compile_seconds,
        "resumed_seconds": self.resumed_seconds,
    }
    if self.per_image is not None:
      out["correct_per_image"] = {
          name: per_image_lib.encode_correct(right)
          for name, right in self.per_image.items()}
      out["correct_per_image_encoding"] = per_image_lib.CORRECT_ENCODING
    return out

  @classmethod
  def from_json(cls, document: Mapping[str, Any]) -> "EvalResult":
    """The evaluation a result file (or ``to_json``) holds; the file's
    other entries (sparsity, settings, metadata) are not part of it.

    Files written before ``resumed_seconds`` existed read as 0; files
    without ``correct_per_image`` as ``per_image=None``.
    """
    n = document["num_examples"]
    encoded = document.get("correct_per_image")
    return cls(
        num_examples=n, num_noise_draws=document["num_noise_draws"],
        attacks={name: AttackResult.from_json(entry)
                 for name, entry in document["attacks"].items()},
        predict_compile_seconds=document["predict_compile_seconds"],
        resumed_seconds=document.get("resumed_seconds", 0.0),
        per_image=(None if encoded is None else {
            name: per_image_lib.decode_correct(text, n)
            for name, text in encoded.items()}))

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, EvalResult):
      return NotImplemented
    return nan_as_none(self.to_json()) == nan_as_none(other.to_json())

  __hash__ = None  # mutable arrays inside: not hashable


def nan_as_none(document: Any) -> Any:
  """``document`` (a result's ``to_json()``) with every NaN as None, as a
  result file writes it: equal results then compare equal (NaN != NaN)."""
  if isinstance(document, Mapping):
    return {k: nan_as_none(v) for k, v in document.items()}
  if isinstance(document, (list, tuple)):
    return [nan_as_none(v) for v in document]
  if isinstance(document, float) and math.isnan(document):
    return None
  return document
