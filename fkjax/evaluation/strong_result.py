"""The strong protocol's result: each attack over seeds, the worst case, typed.

``fkjax.evaluation.strong.repeat_evaluation`` returns a ``RepeatedResult`` (an
evaluation run once per seed: per attack a ``Spread`` of its accuracy, the
per-image worst case as a ``WorstCase``); ``strong_evaluation`` a
``StrongResult``, which adds the protocol's settings, its one-line
description, its wall time and the sanity report. ``to_json`` gives the dict
``eval_strong.json`` holds, key for key as the files have been written
(those written before a key existed included: see each ``from_json``);
``from_json`` reads one back.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from fkjax.evaluation.result import nan_as_none
from fkjax.workdir import per_image as per_image_lib


def _number(value: float | None) -> float:
  """A number as read from a result file, which writes NaN as null."""
  return math.nan if value is None else value


@dataclasses.dataclass(frozen=True)
class Spread:
  """A quantity measured once per seed.

  Attributes:
    mean: the mean over seeds.
    std: the sample standard deviation over seeds (0 for one seed).
    per_seed: each seed's value, in seed order.
  """
  mean: float
  std: float
  per_seed: tuple[float, ...]

  @classmethod
  def of(cls, values: Sequence[float]) -> "Spread":
    """The spread of ``values`` (one per seed)."""
    values = tuple(float(v) for v in values)
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return cls(mean=float(np.mean(values)), std=std, per_seed=values)

  @classmethod
  def from_json(cls, mean: float | None, std: float | None,
                per_seed: Sequence[float | None]) -> "Spread":
    """A spread as a result file writes it, in its three entries."""
    return cls(mean=_number(mean), std=_number(std),
               per_seed=tuple(_number(v) for v in per_seed))


@dataclasses.dataclass(frozen=True)
class SeededAttackResult:
  """What one attack measured over the seeds of a repeated evaluation.

  Attributes:
    accuracy: % of the images still classified right, over seeds.
    correct: how many images that is under seed 0.
    seconds: wall time of the attack, summed over seeds.
    compile_seconds: the part of ``seconds`` spent compiling.
    num_compiles: programs compiled for it by the last seed's evaluation.
  """
  accuracy: Spread
  correct: int
  seconds: float
  compile_seconds: float
  num_compiles: int

  def to_json(self) -> dict[str, Any]:
    """The attack's entry of ``eval_strong.json``'s ``"attacks"``."""
    return {"accuracy": self.accuracy.mean, "std": self.accuracy.std,
            "per_seed": list(self.accuracy.per_seed),
            "correct": self.correct, "seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
            "num_compiles": self.num_compiles}

  @classmethod
  def from_json(cls, entry: Mapping[str, Any]) -> "SeededAttackResult":
    """The attack's entry as ``to_json`` wrote it."""
    return cls(accuracy=Spread.from_json(entry["accuracy"], entry["std"],
                                         entry["per_seed"]),
               correct=entry["correct"], seconds=entry["seconds"],
               compile_seconds=entry["compile_seconds"],
               num_compiles=entry["num_compiles"])


@dataclasses.dataclass(frozen=True, eq=False)
class WorstCase:
  """The per-image worst case: an image is robust only if every attack
  fails on it under every seed (the seeds are more tries of the attacker).

  Attributes:
    accuracy: % of the images robust under every attack and every seed.
    correct: how many images that is.
    num_examples: the images.
    attacks: the attacks combined (``natural`` among them, so that an image
      misclassified when clean is never robust).
    each_seed: each seed's own worst case (%), as a spread.
    robust: bool ``[num_examples]``, which images are robust; None in files
      written before it was recorded, whose ``accuracy`` is the mean of the
      seeds' worst cases.

  Two worst cases are equal when their ``to_json()`` are.
  """
  accuracy: float
  correct: int
  num_examples: int
  attacks: tuple[str, ...]
  each_seed: Spread
  robust: np.ndarray | None

  @property
  def num_seeds(self) -> int:
    """The seeds combined."""
    return len(self.each_seed.per_seed)

  def to_json(self) -> dict[str, Any]:
    """``eval_strong.json``'s ``"worst_case"``; ``robust`` as
    ``correct_per_image`` (``fkjax.workdir.encode_correct``)."""
    if self.robust is None:
      return {"accuracy": self.accuracy, "std": self.each_seed.std,
              "per_seed": list(self.each_seed.per_seed),
              "correct": self.correct, "num_examples": self.num_examples,
              "attacks": list(self.attacks)}
    return {"accuracy": self.accuracy, "correct": self.correct,
            "num_examples": self.num_examples, "attacks": list(self.attacks),
            "num_seeds": self.num_seeds,
            "correct_per_image": per_image_lib.encode_correct(self.robust),
            "per_seed": list(self.each_seed.per_seed),
            "mean_over_seeds": self.each_seed.mean,
            "std": self.each_seed.std}

  @classmethod
  def from_json(cls, document: Mapping[str, Any]) -> "WorstCase":
    """The worst case as ``to_json`` wrote it, or as files written before
    ``correct_per_image`` did (their accuracy: the seeds' mean)."""
    n = document["num_examples"]
    encoded = document.get("correct_per_image")
    mean = (document["accuracy"] if encoded is None
            else document["mean_over_seeds"])
    return cls(accuracy=_number(document["accuracy"]),
               correct=document["correct"], num_examples=n,
               attacks=tuple(document["attacks"]),
               each_seed=Spread.from_json(mean, document["std"],
                                          document["per_seed"]),
               robust=(None if encoded is None
                       else per_image_lib.decode_correct(encoded, n)))

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, WorstCase):
      return NotImplemented
    return nan_as_none(self.to_json()) == nan_as_none(other.to_json())

  __hash__ = None  # a mutable array inside: not hashable


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class RepeatedResult:
  """An evaluation run once per seed (``repeat_evaluation``).

  Attributes:
    num_seeds: the evaluations run.
    num_examples: the (real, non-padding) images evaluated.
    num_noise_draws: noise draws the prediction that scores an adversarial
      image averages over.
    attacks: attack name -> its ``SeededAttackResult``, in the suite's
      order.
    per_image: attack name -> bool ``[num_examples]`` (True: still
      classified right) under seed 0, in data order.
    predict_compile_seconds: seconds spent compiling the prediction, summed
      over seeds.
    resumed_seconds: of the attacks' seconds, those earlier attempts (a
      journal) spent; None in files written before it was recorded.
    worst_case: the per-image worst case (None where none was asked for).

  Two results are equal when their ``to_json()`` are.
  """
  num_seeds: int
  num_examples: int
  num_noise_draws: int
  attacks: Mapping[str, SeededAttackResult]
  per_image: Mapping[str, np.ndarray]
  predict_compile_seconds: float
  resumed_seconds: float | None = 0.0
  worst_case: WorstCase | None = None

  @property
  def names(self) -> list[str]:
    """The attacks' names, in the suite's order."""
    return list(self.attacks)

  def to_json(self) -> dict[str, Any]:
    """The dict of the evaluation's part of ``eval_strong.json``."""
    out: dict[str, Any] = {
        "num_seeds": self.num_seeds, "num_examples": self.num_examples,
        "num_noise_draws": self.num_noise_draws,
        "attacks": {name: entry.to_json()
                    for name, entry in self.attacks.items()},
        "per_image": {name: np.asarray(right, bool).tolist()
                      for name, right in self.per_image.items()},
        "predict_compile_seconds": self.predict_compile_seconds,
    }
    if self.resumed_seconds is not None:
      out["resumed_seconds"] = self.resumed_seconds
    if self.worst_case is not None:
      out["worst_case"] = self.worst_case.to_json()
    return out

  @classmethod
  def _fields_from_json(cls, document: Mapping[str, Any]) -> dict[str, Any]:
    return dict(
        num_seeds=document["num_seeds"],
        num_examples=document["num_examples"],
        num_noise_draws=document["num_noise_draws"],
        attacks={name: SeededAttackResult.from_json(entry)
                 for name, entry in document["attacks"].items()},
        per_image={name: np.asarray(right, bool)
                   for name, right in document["per_image"].items()},
        predict_compile_seconds=document["predict_compile_seconds"],
        resumed_seconds=document.get("resumed_seconds"),
        worst_case=(WorstCase.from_json(document["worst_case"])
                    if "worst_case" in document else None))

  @classmethod
  def from_json(cls, document: Mapping[str, Any]) -> "RepeatedResult":
    """The evaluation ``to_json`` (or a result file) holds; other entries
    are not part of it."""
    return cls(**cls._fields_from_json(document))

  def __eq__(self, other: object) -> bool:
    if type(other) is not type(self):
      return NotImplemented
    return nan_as_none(self.to_json()) == nan_as_none(other.to_json())

  __hash__ = None  # mutable arrays inside: not hashable


@dataclasses.dataclass(frozen=True)
class StrongSettings:
  """What a strong evaluation ran with (``strong_evaluation``'s options,
  ``eot_samples`` and ``check_draws`` resolved; ``num_targets`` 0 without
  APGD-T). ``targeted_on_survivors`` is None in files written before APGD-T
  could attack the other attacks' survivors only."""
  epsilon: float
  stochastic: bool
  eot_samples: int
  check_draws: int
  num_noise_draws: int
  num_iters: int
  n_restarts: int
  targeted: bool
  num_targets: int
  num_seeds: int
  targeted_on_survivors: bool | None = None

  def to_json(self) -> dict[str, Any]:
    """``eval_strong.json``'s ``"settings"``."""
    out = dataclasses.asdict(self)
    if self.targeted_on_survivors is None:
      del out["targeted_on_survivors"]
    return out

  @classmethod
  def from_json(cls, document: Mapping[str, Any]) -> "StrongSettings":
    """The settings as ``to_json`` wrote them."""
    return cls(**document)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class StrongResult(RepeatedResult):
  """The strong protocol's result (``strong_evaluation``): the
  ``RepeatedResult`` of its attacks and what the protocol adds.

  Attributes:
    description: one line saying what was measured.
    settings: what it ran with.
    seconds: wall time of the whole evaluation (of every attempt when
      resumed from a journal), sanity checks excluded.
    sanity: the sanity checks' ``SanityReport.to_dict()`` (None when they
      did not run).
    sanity_text: their printed report (None when they did not run).
  """
  description: str
  settings: StrongSettings
  seconds: float
  sanity: Mapping[str, Any] | None = None
  sanity_text: str | None = None

  def to_json(self) -> dict[str, Any]:
    """The dict ``eval_strong.json`` holds (without the sparsity, step and
    metadata ``fkjax.evaluation.run`` writes beside it)."""
    out = {"protocol": "strong", "description": self.description,
           "settings": self.settings.to_json(), **super().to_json(),
           "seconds": self.seconds}
    if self.sanity is not None:
      out["sanity"] = self.sanity
    if self.sanity_text is not None:
      out["sanity_text"] = self.sanity_text
    return out

  @classmethod
  def from_json(cls, document: Mapping[str, Any]) -> "StrongResult":
    """The strong evaluation a result file (or ``to_json``) holds."""
    if document.get("protocol") != "strong":
      raise ValueError(f"not a strong protocol's result (protocol "
                       f"{document.get('protocol')!r})")
    return cls(**cls._fields_from_json(document),
               description=document["description"],
               settings=StrongSettings.from_json(document["settings"]),
               seconds=document["seconds"], sanity=document.get("sanity"),
               sanity_text=document.get("sanity_text"))
