"""The strong protocol: APGD suite, per-image worst case, seeds, sanity.

``strong_evaluation`` runs ``fkjax.evaluation.suites.strong_attacks`` (APGD-CE
and APGD-DLR, APGD-T on the images they leave robust, with EOT for a noisy
model), counts an image as robust only if every attack fails on it under
every seed (``worst_case``, ``worst_case_over_seeds``), repeats the
evaluation over several seeds (``repeat_evaluation``) and runs the sanity
checks of ``fkjax.evaluation.sanity`` with it.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np

from fkjax import attacks as attacks_lib
from fkjax.evaluation import journal as eval_journal
from fkjax.evaluation import suites as eval_suites
from fkjax.evaluation import sanity
from fkjax.evaluation.loop import Evaluator
from fkjax.config.names import STRONG_COLUMNS
from fkjax.evaluation.result import EvalResult
from fkjax.evaluation.strong_result import RepeatedResult
from fkjax.evaluation.strong_result import SeededAttackResult
from fkjax.evaluation.strong_result import Spread
from fkjax.evaluation.strong_result import StrongResult
from fkjax.evaluation.strong_result import StrongSettings
from fkjax.evaluation.strong_result import WorstCase


def worst_case(results: EvalResult,
               names: Sequence[str] | None = None) -> WorstCase:
  """Per-image worst case: an image is robust only if EVERY attack fails.

  Args:
    results: the result of ``robust_accuracy(..., per_image=True)``.
    names: the attacks to combine (default: all of them, ``natural``
      included, so an image misclassified when clean is never robust).

  Returns:
    The ``WorstCase`` of one seed; each image counts once however many
    attacks break it.
  """
  return worst_case_over_seeds(
      [results], list(names) if names is not None else results.names)


def _batch_source(batches: Callable[[], Iterable[Mapping[str, Any]]]
                  | Sequence[Mapping[str, Any]]
                  ) -> Callable[[], Iterable[Mapping[str, Any]]]:
  if callable(batches):
    return batches
  if isinstance(batches, Sequence):
    return lambda: batches
  raise TypeError("batches must be a sequence of batches or a function "
                  "returning a fresh iterable (an iterator can be read once)")


def repeat_evaluation(evaluator: Evaluator,
                      variables: Any,
                      batches: Callable[[], Iterable[Mapping[str, Any]]]
                      | Sequence[Mapping[str, Any]],
                      key: jax.Array,
                      *,
                      num_seeds: int = 3,
                      worst_case_of: Sequence[str] | None = None,
                      progress: bool = False,
                      num_batches: int | None = None,
                      journal: eval_journal.Journal | None = None
                      ) -> RepeatedResult:
  """Runs an evaluation with ``num_seeds`` keys: mean and spread per attack.

  A noisy model's robust accuracy is itself random (the attacks' and the
  prediction's noise draws), so a single number hides its spread. Seed
  ``s`` uses ``jax.random.fold_in(key, s)``; the compiled attacks are
  shared by all seeds.

  Args:
    evaluator: an ``Evaluator`` with the attacks.
    variables: the model variables.
    batches: a sequence of batches, or a function returning a fresh iterable
      of them (read once per seed).
    key: PRNG key.
    num_seeds: evaluations to run (>= 1).
    worst_case_of: attacks the per-image worst case combines (default: all
      of the evaluator's); an empty sequence skips it.
    progress: progress in model calls, one display per seed.
    num_batches: batches per seed, for the progress total.
    journal: where each seed's finished batches are kept
      (``journal.scoped("seed<s>")``), so that a killed evaluation resumes.

  Returns:
    Per attack its accuracy's spread over seeds (``correct``: seed 0's;
    seconds summed over seeds), seed 0's per-image vectors, and the worst
    case over every attack and every seed (``worst_case_over_seeds``).
  """
  if num_seeds < 1:
    raise ValueError(f"num_seeds must be >= 1, got {num_seeds}.")
  source = _batch_source(batches)
  names = evaluator.names
  combine = list(names) if worst_case_of is None else list(worst_case_of)
  runs = []
  for seed in range(num_seeds):
    run = evaluator(variables, source(), jax.random.fold_in(key, seed),
                    progress=progress, per_image=True,
                    num_batches=num_batches,
                    desc=f"seed {seed + 1}/{num_seeds}",
                    journal=(journal.scoped(f"seed{seed}")
                             if journal is not None else None))
    runs.append(run)
  return _combine_seeds(
      runs, names,
      worst_case_over_seeds(runs, combine) if combine else None)


def _combine_seeds(runs: Sequence[EvalResult], names: Sequence[str],
                   worst: WorstCase | None) -> RepeatedResult:
  """``repeat_evaluation``'s result from its runs and worst case."""
  first = runs[0]
  attacks_out = {}
  for name in names:
    entries = [r.attacks[name] for r in runs]
    attacks_out[name] = SeededAttackResult(
        accuracy=Spread.of([e.accuracy for e in entries]),
        correct=entries[0].correct,
        seconds=sum(e.seconds for e in entries),
        compile_seconds=sum(e.compile_seconds for e in entries),
        num_compiles=entries[-1].num_compiles)
  return RepeatedResult(
      num_seeds=len(runs), num_examples=first.num_examples,
      num_noise_draws=first.num_noise_draws, attacks=attacks_out,
      per_image=first.per_image,
      predict_compile_seconds=sum(r.predict_compile_seconds for r in runs),
      resumed_seconds=sum(r.resumed_seconds for r in runs),
      worst_case=worst)


def _percent(robust: np.ndarray) -> float:
  return 100.0 * float(robust.mean()) if robust.shape[0] else float("nan")


def worst_case_over_seeds(runs: Sequence[EvalResult],
                          names: Sequence[str]) -> WorstCase:
  """Per-image worst case over every attack AND every seed.

  An image broken by any attack under any seed is broken: the seeds are
  more tries of the attacker, not samples to average. The per-seed worst
  cases are reported beside it as their spread (``each_seed``).

  Args:
    runs: ``robust_accuracy(..., per_image=True)`` results of the same
      images, one per seed.
    names: the attacks to combine (``natural`` included, so that an image
      misclassified when clean is never robust).
  """
  if not names:
    raise ValueError("worst_case needs at least one attack")
  each = [np.logical_and.reduce([np.asarray(run.per_image[n], bool)
                                 for n in names]) for run in runs]
  robust = np.logical_and.reduce(each)
  return WorstCase(accuracy=_percent(robust), correct=int(robust.sum()),
                   num_examples=int(robust.shape[0]), attacks=tuple(names),
                   each_seed=Spread.of([_percent(r) for r in each]),
                   robust=robust)


def strong_evaluation(apply_fn: attacks_lib.ApplyFn, variables: Any,
                      batches: Callable[[], Iterable[Mapping[str, Any]]]
                      | Sequence[Mapping[str, Any]],
                      key: jax.Array, *, epsilon: float = 8 / 255,
                      stochastic: bool = False,
                      eot_samples: int | None = None,
                      check_draws: int | None = None,
                      num_noise_draws: int = 1, num_iters: int = 100,
                      n_restarts: int = 1, targeted: bool = True,
                      num_targets: int = 9,
                      targeted_on_survivors: bool = True,
                      num_seeds: int = 3,
                      sanity_batches: Sequence[Mapping[str, Any]]
                      | None = None,
                      sanity_options: Mapping[str, Any] | None = None,
                      progress: bool = False, num_batches: int | None = None,
                      journal: eval_journal.Journal | None = None
                      ) -> StrongResult:
  """The strong protocol of the module docstring on ``batches``: its
  attacks' accuracies and their per-image worst case (clean images
  included) as mean and std over ``num_seeds`` seeds, and the sanity
  checks on ``sanity_batches`` with the same settings.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    batches: a sequence of batches or a function returning a fresh iterable
      (dicts with ``image``, ``label`` and optional ``mask``).
    key: PRNG key.
    epsilon, stochastic, eot_samples, check_draws, num_iters, n_restarts,
      targeted, num_targets: see ``eval_suites.strong_attacks``.
    num_noise_draws: noise draws the prediction that scores an adversarial
      image averages its softmax over (recorded in the result).
    targeted_on_survivors: APGD-T attacks only the images APGD-CE and
      APGD-DLR left robust (AutoAttack's order; ``Evaluator``'s
      ``survivors_only``), so its 9 runs cost what those images need; its
      reported accuracy is then the worst case over the three. False: every
      image right when clean, and APGD-T's own accuracy. Every APGD attack
      attacks only the images classified right when clean
      (``survivors_plan``), so each attack's accuracy counts an image
      misclassified when clean as broken, as AutoAttack's and torchattacks'.
    num_seeds: evaluation seeds (3 gives mean +- std; 1 for a quick run).
    sanity_batches: batches for the sanity checks (a few hundred images;
      None skips them).
    sanity_options: extra keyword arguments of ``sanity.sanity_checks``.
    progress: progress in model calls (see ``robust_accuracy``).
    num_batches: batches of ``batches``, for the progress total.
    journal: keeps the finished batches of the seeds
      (``repeat_evaluation``) and of the sanity checks (``scoped("sanity")``).

  Returns:
    ``repeat_evaluation``'s result with the protocol's one-line
    ``description``, its ``settings`` (every option above, the resolved
    ``eot_samples`` and ``check_draws`` included), its wall time
    ``seconds`` (of every attempt when resumed from ``journal``, sanity
    checks excluded) and, with ``sanity_batches``, the sanity report
    (``sanity``: ``SanityReport.to_dict()``, ``sanity_text``); its
    ``to_json()`` is ``eval_strong.json``'s content.
  """
  eot_samples, check_draws = eval_suites.strong_settings(
      stochastic=stochastic, eot_samples=eot_samples, check_draws=check_draws)
  settings = StrongSettings(
      epsilon=epsilon, stochastic=stochastic, eot_samples=eot_samples,
      check_draws=check_draws, num_noise_draws=num_noise_draws,
      num_iters=num_iters, n_restarts=n_restarts, targeted=targeted,
      num_targets=num_targets if targeted else 0, num_seeds=num_seeds,
      targeted_on_survivors=bool(targeted and targeted_on_survivors))
  suite = _suite(settings)
  seeds, seconds = _run_seeds(apply_fn, variables, batches, key, settings,
                              suite, progress=progress,
                              num_batches=num_batches, journal=journal)
  report = None if sanity_batches is None else _sanity_checks(
      apply_fn, variables, sanity_batches, key, settings, sanity_options,
      progress=progress, journal=journal)
  return StrongResult(
      **{f.name: getattr(seeds, f.name) for f in dataclasses.fields(seeds)},
      description=describe(settings, suite), settings=settings,
      seconds=seconds, sanity=None if report is None else report.to_dict(),
      sanity_text=None if report is None else report.format())


def _suite(settings: StrongSettings) -> dict[str, eval_suites.Attack]:
  """``eval_suites.strong_attacks`` at the protocol's ``settings``."""
  s = settings
  return eval_suites.strong_attacks(
      s.epsilon, stochastic=s.stochastic, eot_samples=s.eot_samples,
      check_draws=s.check_draws, num_iters=s.num_iters,
      n_restarts=s.n_restarts, targeted=s.targeted,
      num_targets=s.num_targets)


def _run_seeds(apply_fn: attacks_lib.ApplyFn, variables: Any,
               batches: Callable[[], Iterable[Mapping[str, Any]]]
               | Sequence[Mapping[str, Any]],
               key: jax.Array, settings: StrongSettings,
               suite: Mapping[str, eval_suites.Attack], *, progress: bool,
               num_batches: int | None,
               journal: eval_journal.Journal | None
               ) -> tuple[RepeatedResult, float]:
  """``repeat_evaluation`` of ``suite`` at the protocol's ``settings``, and
  its wall time (seconds)."""
  start = time.perf_counter()
  evaluator = Evaluator(apply_fn, suite,
                        num_noise_draws=settings.num_noise_draws,
                        survivors_only=survivors_plan(
                            suite, settings.targeted_on_survivors),
                        batch_key="config.eval.batch_size")
  seeds = repeat_evaluation(evaluator, variables, batches, key,
                            num_seeds=settings.num_seeds, progress=progress,
                            num_batches=num_batches, journal=journal)
  # A resumed evaluation's seconds include what its earlier attempts spent.
  return seeds, time.perf_counter() - start + seeds.resumed_seconds


def _sanity_checks(apply_fn: attacks_lib.ApplyFn, variables: Any,
                   batches: Sequence[Mapping[str, Any]], key: jax.Array,
                   settings: StrongSettings,
                   options: Mapping[str, Any] | None, *, progress: bool,
                   journal: eval_journal.Journal | None
                   ) -> sanity.SanityReport:
  """``sanity.sanity_checks`` at the protocol's ``settings`` (``options``
  override them), on a key of their own and ``journal``'s part
  ``"sanity"``."""
  s = settings
  return sanity.sanity_checks(
      apply_fn, variables, batches, jax.random.fold_in(key, 1_000_003),
      progress=progress,
      journal=journal.scoped("sanity") if journal is not None else None,
      **{**dict(epsilon=s.epsilon, stochastic=s.stochastic,
                eot_samples=s.eot_samples, check_draws=s.check_draws,
                num_noise_draws=s.num_noise_draws,
                apgd_budget=(s.num_iters, s.n_restarts)),
         **(options or {})})


def survivors_plan(suite: Iterable[str], targeted_on_survivors: bool
                   ) -> dict[str, list[str]]:
  """Which images each attack of the strong ``suite`` attacks: every APGD
  attack only the images classified right when clean (as AutoAttack's and
  torchattacks' APGD: an image misclassified when clean is broken by every
  attack, so attacking it is wasted work), and with
  ``targeted_on_survivors`` APGD-T only those APGD-CE and APGD-DLR left
  robust too (``Evaluator``'s ``survivors_only``)."""
  names = list(suite)
  plan = ({name: ["natural"] for name in names if name != "natural"}
          if "natural" in names else {})
  if targeted_on_survivors and "apgd_t" in names:
    plan["apgd_t"] = names[:names.index("apgd_t")]
  return plan


def describe(settings: StrongSettings, suite: Iterable[str]) -> str:
  """One line saying what a strong evaluation with ``settings`` and
  attacks ``suite`` measured."""
  s = settings
  labels = [STRONG_COLUMNS[n] for n in suite if n != "natural"]
  return (
      f"strong protocol: {' + '.join(labels)}, {s.num_iters} iterations, "
      f"{s.n_restarts} restart(s), l_inf eps={s.epsilon * 255:g}/255, "
      f"EOT {s.eot_samples} sample(s) per gradient, success checked on "
      f"{s.check_draws or 'the gradient pass'} fresh draw(s), adversarial "
      f"images scored on {s.num_noise_draws} noise draw(s); "
      + "each APGD attack attacks only the images classified right when "
      "clean; "
      + ("APGD-T only those APGD-CE and APGD-DLR left robust; "
         if s.targeted_on_survivors else "")
      + f"each attack: "
      f"mean +- std over {s.num_seeds} seed(s); worst case: robust = every "
      f"attack fails on the image under every seed")
