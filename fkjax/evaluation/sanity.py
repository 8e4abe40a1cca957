"""Sanity checks of a robustness evaluation (Carlini et al., 2019).

"On Evaluating Adversarial Robustness" lists symptoms of an evaluation that
a defence fools, most often by masking its gradient. ``sanity_checks`` runs
six of them on a few batches and says loudly when one fails:

* ``epsilon_sweep``: accuracy under APGD-CE (the strong protocol's attack,
  its step size adapting to epsilon) against epsilon in {0, 2, 4, 8, 16, 32,
  64}/255 never rises (beyond noise) as epsilon grows;
* ``sweep_reaches_zero``: at the largest epsilon (64/255: the image can
  be made nearly grey) the accuracy under APGD-CE is ~0;
* ``apgd_converged``: the reported APGD-CE (its iterations and restarts)
  is not weaker, beyond noise, than APGD-CE with twice the iterations and
  twice the restarts: its figure is not an overestimate for want of budget;
* ``more_steps``: PGD with many steps is not weaker than with few (PGD
  from a random start, keeping its best iterate, step
  ``2.5 * eps / steps`` so that every run can cross its ball);
* ``more_eot``: for a noisy model, PGD with EOT over K draws is not weaker
  than with one draw;
* ``blackbox_weaker``: the gradient-free NAttack (the paper's variant) is
  not stronger than the white-box attacks together (the APGD-CE runs
  included).

Every comparison is paired, image by image: with ``b`` images the stronger
setting leaves robust but the weaker breaks and ``c`` the reverse, a check
fails when ``b - c`` exceeds ``z * sqrt(b + c)`` images (a McNemar-type
bound for two attacks of equal strength) and ``min_points`` percentage
points. With ``n`` images the smallest excess that can fail is
``max(100 * (floor(z^2) + 1) / n, min_points)`` points (no image the other
way): 1 point on the strong protocol's 500 images, 5 on 100 (each check
reports its own as ``detectable_points``). A failure means the robust
accuracies of that evaluation should not be trusted: the report says
"POSSIBLE GRADIENT MASKING".
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from fkjax import attacks as attacks_lib
from fkjax.evaluation import journal as eval_journal
from fkjax.evaluation import loop as eval_loop
from fkjax.evaluation import result as eval_result
from fkjax.evaluation import suites as eval_suites

SWEEP_EPSILONS = tuple(e / 255 for e in (0, 2, 4, 8, 16, 32, 64))

BANNER = "!!! POSSIBLE GRADIENT MASKING !!!"


@dataclasses.dataclass
class Check:
  """One sanity check: ``passed`` is None when it was skipped."""
  name: str
  passed: bool | None
  summary: str
  details: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SanityReport:
  """The checks, the settings they ran with, and the accuracies measured."""
  checks: list[Check]
  settings: dict[str, Any]
  accuracies: dict[str, float]

  @property
  def passed(self) -> bool:
    """True when no check failed (skipped checks do not fail)."""
    return all(c.passed is not False for c in self.checks)

  @property
  def failed(self) -> list[str]:
    return [c.name for c in self.checks if c.passed is False]

  def to_dict(self) -> dict[str, Any]:
    return {"passed": self.passed, "failed": self.failed,
            "warning": None if self.passed else BANNER,
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "settings": self.settings, "accuracies": self.accuracies}

  def format(self) -> str:
    """Printable report; a failed check puts a banner above and below."""
    lines = []
    if not self.passed:
      lines += [BANNER, f"failed sanity checks: {', '.join(self.failed)}; "
                "the robust accuracies of this evaluation may be "
                "overestimates (Carlini et al. 2019)."]
    lines.append(f"sanity checks ({self.settings['num_examples']} images):")
    for c in self.checks:
      status = {True: "PASS", False: "FAIL", None: "skip"}[c.passed]
      lines.append(f"  [{status}] {c.name}: {c.summary}")
    if not self.passed:
      lines.append(BANNER)
    return "\n".join(lines)


def paired_excess(stronger: np.ndarray, weaker: np.ndarray, *, z: float = 2.0,
                  min_points: float = 1.0) -> dict[str, Any]:
  """Whether an attack expected to be stronger leaves more images robust.

  Args:
    stronger: bool ``[n]``, per image, robust under the attack expected to
      be at least as strong.
    weaker: bool ``[n]``, robust under the other one.
    z: standard deviations of the paired difference allowed as noise.
    min_points: smallest excess (percentage points) ever flagged.

  Returns:
    ``{"excess_points": (b - c) / n in %, "tolerance_points", "flagged":
    bool, "b": int, "c": int, "detectable_points"}`` where ``b`` counts
    images robust under ``stronger`` only and ``c`` under ``weaker`` only,
    and ``detectable_points`` is the smallest excess that can fail at this
    ``n`` (:func:`detectable_points`).
  """
  stronger = np.asarray(stronger, bool)
  weaker = np.asarray(weaker, bool)
  n = max(int(stronger.size), 1)
  b = int(np.sum(stronger & ~weaker))
  c = int(np.sum(weaker & ~stronger))
  excess = 100.0 * (b - c) / n
  tolerance = max(min_points, 100.0 * z * math.sqrt(b + c) / n)
  return {"excess_points": excess, "tolerance_points": tolerance,
          "flagged": bool(excess > tolerance), "b": b, "c": c,
          "detectable_points": detectable_points(n, z=z,
                                                 min_points=min_points)}


def detectable_points(n: int, *, z: float = 2.0,
                      min_points: float = 1.0) -> float:
  """The smallest excess (points) ``paired_excess`` can flag on ``n``
  images: ``b`` images one way and none the other fail once ``b > z^2``."""
  return max(100.0 * (math.floor(z * z) + 1) / max(n, 1), min_points)


def _pgd(epsilon, num_steps, eot_samples, check_draws):
  if epsilon == 0:
    return eval_suites.natural
  return functools.partial(
      attacks_lib.pgd, epsilon=epsilon,
      step_size=attacks_lib.sweep_step_size(epsilon, num_steps),
      num_steps=num_steps, random_start=True, loss="ce",
      eot_samples=eot_samples, unroll=1, return_best=True,
      check_draws=check_draws)


def _apgd(epsilon, num_iters, n_restarts, eot_samples, check_draws):
  if epsilon == 0:
    return eval_suites.natural
  # Every image is attacked: the paired comparisons count the clean-
  # misclassified ones either way, and leaving them out would compile a
  # lone run once per bucket size.
  return functools.partial(
      attacks_lib.apgd, epsilon=epsilon, num_iters=num_iters,
      n_restarts=n_restarts, loss="ce", eot_samples=eot_samples,
      check_draws=check_draws, skip_misclassified=False)


def sanity_checks(apply_fn: attacks_lib.ApplyFn, variables: Any,
                  batches: Sequence[Mapping[str, Any]], key: jax.Array, *,
                  epsilon: float = 8 / 255, stochastic: bool = False,
                  eot_samples: int | None = None,
                  check_draws: int | None = None, num_noise_draws: int = 1,
                  sweep_epsilons: Sequence[float] = SWEEP_EPSILONS,
                  sweep_steps: int = 20, steps: tuple[int, int] = (20, 100),
                  apgd_budget: tuple[int, int] = (100, 1),
                  nattack_population: int = 100, nattack_iters: int = 100,
                  nattack_chunk: int | None = None,
                  nattack_image_chunk: int | None = None,
                  zero_threshold: float = 2.0, z: float = 2.0,
                  min_points: float = 1.0, progress: bool = False,
                  journal: eval_journal.Journal | None = None
                  ) -> SanityReport:
  """Runs the sanity checks of the module docstring (it names each one's
  attack) on ``batches``.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    batches: a few batches (dicts with ``image``, ``label``, optional
      ``mask``); a few hundred images give tolerances of a few points.
    key: PRNG key.
    epsilon: the evaluation's radius: ``more_steps``, ``more_eot`` and
      ``blackbox_weaker`` attack there.
    stochastic: whether the model draws noise at test time.
    eot_samples: EOT draws per gradient of the white-box attacks (20 if
      ``stochastic``, as ``eval_suites.strong_attacks``).
    check_draws: fresh draws an iterate must fool (3 if ``stochastic``).
    num_noise_draws: draws the scoring prediction averages over.
    sweep_epsilons: the sweep's radii, increasing (0 = clean accuracy).
    sweep_steps: APGD-CE iterations of the sweep.
    steps: ``(few, many)`` PGD steps of ``more_steps``; ``few`` is also the
      ``more_eot`` attack's.
    apgd_budget: ``(iterations, restarts)`` of the reported APGD-CE (the
      strong protocol's); ``apgd_converged`` compares it with twice both.
    nattack_population, nattack_iters: NAttack's budget (kept small: a
      sanity check, not an evaluation).
    nattack_chunk, nattack_image_chunk: NAttack's memory bounds
      (``attacks.nattack``'s ``chunk`` and ``image_chunk``).
    zero_threshold: largest accuracy (%) accepted at the largest radius.
    z, min_points: the noise tolerance of every comparison (see
      ``paired_excess``).
    progress: progress output (see :func:`fkjax.workdir.metric_logging.progress`).
    journal: keeps the finished batches, so that a killed run resumes
      (:mod:`fkjax.evaluation.journal`).

  Returns:
    A ``SanityReport``; ``report.format()`` prints it and
    ``report.to_dict()`` stores it.
  """
  eot_samples, check_draws = eval_suites.strong_settings(
      stochastic=stochastic, eot_samples=eot_samples, check_draws=check_draws)
  sweep, plan, roles = _plan_attacks(
      sweep_epsilons, sweep_steps, epsilon, stochastic, eot_samples,
      check_draws, apgd_budget, steps, nattack=dict(
          population=nattack_population, max_iters=nattack_iters,
          chunk=nattack_chunk, image_chunk=nattack_image_chunk))
  results = eval_loop.robust_accuracy(
      apply_fn, variables, batches, plan.suite, key,
      num_noise_draws=num_noise_draws, progress=progress, per_image=True,
      journal=journal)
  seen = _Seen(results.per_image, results.accuracies(),
               functools.partial(paired_excess, z=z, min_points=min_points))
  checks = [
      _epsilon_sweep(seen, sweep, roles.sweep, sweep_steps),
      _sweep_reaches_zero(seen, sweep, roles.sweep, zero_threshold),
      _apgd_converged(seen, roles, apgd_budget),
      _more_steps(seen, roles, steps),
      _more_eot(seen, roles, steps[0], stochastic, eot_samples),
      _blackbox_weaker(seen, roles, plan.suite, sweep, epsilon),
  ]
  return SanityReport(checks, _settings(results, dict(
      epsilon=epsilon, stochastic=stochastic, eot_samples=eot_samples,
      check_draws=check_draws, num_noise_draws=num_noise_draws,
      sweep_steps=sweep_steps, steps=list(steps),
      apgd_budget=list(apgd_budget), nattack_population=nattack_population,
      nattack_iters=nattack_iters, z=z, min_points=min_points,
      zero_threshold=zero_threshold)), seen.accuracy)


def _settings(results: eval_result.EvalResult,
              options: Mapping[str, Any]) -> dict[str, Any]:
  """The report's ``settings``: the number of images, the checks'
  ``options`` and each attack's wall time (seconds)."""
  return {"num_examples": results.num_examples, **options,
          "seconds": {name: e.seconds for name, e in results.attacks.items()}}


class _Plan:
  """The attacks the checks need, one per distinct configuration: equal
  ones (the sweep's at the evaluation's radius, say) are run once."""

  def __init__(self):
    self.suite: dict[str, eval_suites.Attack] = {}
    self._names: dict[tuple, str] = {}

  def add(self, name: str, config: tuple, attack: eval_suites.Attack) -> str:
    """The name the attack of ``config`` runs under (``name`` if new)."""
    if config not in self._names:
      self._names[config] = name
      self.suite[name] = attack
    return self._names[config]


@dataclasses.dataclass
class _Roles:
  """Which attack of the plan plays which part in the checks."""
  sweep: list[str]
  apgd: str
  apgd_more: str
  few: str
  many: str
  single: str | None
  nattack: str


def _at_epsilon(plan: _Plan, epsilon: float, stochastic: bool,
                eot_samples: int, check_draws: int,
                apgd_budget: tuple[int, int], steps: tuple[int, int]
                ) -> dict[str, str | None]:
  """Adds the white-box attacks at the evaluation's radius; their roles."""
  iters, restarts = apgd_budget
  few, many = steps
  return dict(
      apgd=plan.add(f"apgd{iters}x{restarts}",
                    ("apgd", epsilon, iters, restarts),
                    _apgd(epsilon, iters, restarts, eot_samples,
                          check_draws)),
      apgd_more=plan.add(
          f"apgd{2 * iters}x{2 * restarts}",
          ("apgd", epsilon, 2 * iters, 2 * restarts),
          _apgd(epsilon, 2 * iters, 2 * restarts, eot_samples, check_draws)),
      few=plan.add(f"pgd{few}", ("pgd", epsilon, few, eot_samples),
                   _pgd(epsilon, few, eot_samples, check_draws)),
      many=plan.add(f"pgd{many}", ("pgd", epsilon, many, eot_samples),
                    _pgd(epsilon, many, eot_samples, check_draws)),
      single=(plan.add(f"pgd{few}_eot1", ("pgd", epsilon, few, 1),
                       _pgd(epsilon, few, 1, check_draws))
              if stochastic and eot_samples > 1 else None))


def _plan_attacks(sweep_epsilons: Sequence[float], sweep_steps: int,
                  epsilon: float, stochastic: bool, eot_samples: int,
                  check_draws: int, apgd_budget: tuple[int, int],
                  steps: tuple[int, int], *, nattack: Mapping[str, Any]
                  ) -> tuple[list[float], _Plan, _Roles]:
  """The sweep's radii (sorted), the attacks the checks run and the part
  each plays: the sweep's APGD-CE at every radius, the white-box attacks
  at ``epsilon`` (``_at_epsilon``) and NAttack (``nattack``: its keyword
  arguments besides ``epsilon``), in this order."""
  sweep = sorted(float(e) for e in sweep_epsilons)
  if len(sweep) < 2:
    raise ValueError("sweep_epsilons needs at least two radii")
  few, many = steps
  if not 0 < few < many:
    raise ValueError(f"steps must be (few, many) with 0 < few < many, got "
                     f"{steps}")
  plan = _Plan()
  roles = _Roles(
      sweep=[plan.add(f"sweep_{e * 255:g}", ("apgd", e, sweep_steps, 1),
                      _apgd(e, sweep_steps, 1, eot_samples, check_draws))
             for e in sweep],
      **_at_epsilon(plan, epsilon, stochastic, eot_samples, check_draws,
                    apgd_budget, steps),
      nattack=plan.add("nattack", ("nattack",), functools.partial(
          attacks_lib.nattack, epsilon=epsilon, **nattack)))
  return sweep, plan, roles


@dataclasses.dataclass
class _Seen:
  """What the attacks did: per attack, which images stayed robust, and its
  accuracy (%); ``compare`` is ``paired_excess`` at the checks' noise."""
  robust: Mapping[str, np.ndarray]
  accuracy: dict[str, float]
  compare: Any


def _epsilon_sweep(seen: _Seen, sweep: Sequence[float], names: Sequence[str],
                   sweep_steps: int) -> Check:
  """1. Accuracy never rises (beyond noise) as epsilon grows."""
  rises = []
  for (e0, a), (e1, b) in zip(zip(sweep, names), zip(sweep[1:], names[1:])):
    result = seen.compare(seen.robust[b], seen.robust[a])
    if result["flagged"]:
      rises.append(f"{e0 * 255:g}->{e1 * 255:g}/255 "
                   f"(+{result['excess_points']:.1f} points)")
  curve = ", ".join(f"{e * 255:g}: {seen.accuracy[name]:.1f}"
                    for e, name in zip(sweep, names))
  return Check(
      "epsilon_sweep", not rises,
      f"accuracy % at eps/255 {{{curve}}}" +
      (f"; RISES at {'; '.join(rises)}" if rises else
       "; never rises beyond noise"),
      {"epsilons": list(sweep),
       "accuracy": [seen.accuracy[nm] for nm in names],
       "rises": rises, "attack": f"APGD-CE, {sweep_steps} iterations"})


def _sweep_reaches_zero(seen: _Seen, sweep: Sequence[float],
                        names: Sequence[str], zero_threshold: float
                        ) -> Check:
  """2. The accuracy reaches ~0 at the largest radius."""
  top = seen.accuracy[names[-1]]
  return Check(
      "sweep_reaches_zero", top <= zero_threshold,
      f"{top:.1f}% at eps={sweep[-1] * 255:g}/255 "
      f"({'<=' if top <= zero_threshold else 'ABOVE'} {zero_threshold:g}%)",
      {"accuracy": top, "threshold": zero_threshold})


def _paired(seen: _Seen, name: str, stronger: str, weaker: str,
            stronger_label: str, weaker_label: str, *,
            detectable: bool = False) -> Check:
  """Check ``name``: attack ``stronger`` leaves no more images robust than
  ``weaker`` beyond noise (``paired_excess``)."""
  result = seen.compare(seen.robust[stronger], seen.robust[weaker])
  return Check(
      name, not result["flagged"],
      f"{stronger_label} {seen.accuracy[stronger]:.1f}% vs {weaker_label} "
      f"{seen.accuracy[weaker]:.1f}% (excess {result['excess_points']:+.1f}, "
      f"tolerance {result['tolerance_points']:.1f}"
      + (f", can fail from {result['detectable_points']:.1f} points)"
         if detectable else " points)"), result)


def _apgd_converged(seen: _Seen, roles: _Roles,
                    apgd_budget: tuple[int, int]) -> Check:
  """3. The reported APGD has converged: twice its budget breaks no more."""
  iters, restarts = apgd_budget
  return _paired(seen, "apgd_converged", roles.apgd, roles.apgd_more,
                 f"APGD-CE {iters} it. x {restarts}",
                 f"{2 * iters} it. x {2 * restarts}", detectable=True)


def _more_steps(seen: _Seen, roles: _Roles, steps: tuple[int, int]) -> Check:
  """4. More steps do not help the model."""
  few, many = steps
  return _paired(seen, "more_steps", roles.many, roles.few, f"PGD-{many}",
                 f"PGD-{few}")


def _more_eot(seen: _Seen, roles: _Roles, few: int, stochastic: bool,
              eot_samples: int) -> Check:
  """5. More EOT samples do not help the model."""
  if roles.single is None:
    return Check(
        "more_eot", None,
        "deterministic model: EOT changes nothing" if not stochastic else
        "eot_samples is 1: nothing to compare")
  return _paired(seen, "more_eot", roles.few, roles.single,
                 f"PGD-{few} EOT-{eot_samples}", "EOT-1")


def _blackbox_weaker(seen: _Seen, roles: _Roles, suite: Sequence[str],
                     sweep: Sequence[float], epsilon: float) -> Check:
  """6. The black-box attack is not stronger than the white-box ones (the
  sweep's attack at the evaluation's radius among them)."""
  white = [name for name in suite
           if name != roles.nattack and not name.startswith("sweep_")]
  at_eps = [nm for e, nm in zip(sweep, roles.sweep) if e == epsilon]
  white = list(dict.fromkeys(white + at_eps))
  white_robust = np.logical_and.reduce([seen.robust[nm] for nm in white])
  result = seen.compare(white_robust, seen.robust[roles.nattack])
  white_accuracy = (100.0 * float(white_robust.mean()) if white_robust.size
                    else float("nan"))
  return Check(
      "blackbox_weaker", not result["flagged"],
      f"NAttack {seen.accuracy[roles.nattack]:.1f}% vs white-box worst case "
      f"{white_accuracy:.1f}% over {', '.join(white)} (excess "
      f"{result['excess_points']:+.1f}, tolerance "
      f"{result['tolerance_points']:.1f}, can fail from "
      f"{result['detectable_points']:.1f} points)",
      {**result, "white_box": white, "white_box_accuracy": white_accuracy})
