"""A run's time before it runs (dry runs, the tables' estimates): a cost
model of its training and evaluations in ResNet20 step times, those of 2
idle CPU cores (docs/performance.md) unless another machine's are given
(:mod:`reproduce.run.calibrate`)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

from reproduce.run import plan as plan_lib
from reproduce.run import runs as runs_lib
from reproduce.run.runs import ExtraEvalRun, Run
from reproduce.spec import scales as scales_lib
from reproduce.spec import tables as tables_lib


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds of ResNet20 training steps at batch 128 on some machine.

  Attributes:
    clean_step: a clean training step.
    attack_iteration: one PGD iteration more in a step.
  """
  clean_step: float
  attack_iteration: float


# The reference machine's (2 idle vCPUs of an AMD EPYC with AVX-512):
# a clean step, one attack iteration; per image of one evaluation attack
# iteration; multipliers per ensemble size measured for PGD-10 steps (En2
# 4.07 s, En5 12.2 s vs ResNet20 1.73 s). Another machine's step times
# (reproduce.run.calibrate) scale the estimates.
REFERENCE_STEP_TIMES = StepTimes(clean_step=0.303, attack_iteration=0.1424)
_EVAL_ITER_PER_IMAGE = 10.08 / 500 / 21
_MEMBERS = {1: 1.0, 2: 2.36, 5: 7.06}
# A noise draw's gradient under the strong protocol costs more than the
# training multipliers say: En2ResNet20, 200 images, EOT 10 took 1,419 s of
# APGD (eval_strong.json) against 1,007 s predicted without this factor.
_NOISY_EOT_COST = 1.41
# Attack iterations per image of each paper-protocol attack but NAttack
# (costed by its queries below); keyed by fkjax.config.names.ATTACK_NAMES.
_EVAL_ITERS = {"natural": 1, "fgsm": 2, "ifgsm20": 21, "cw": 21,
               "cw_authors": 51}
# One NAttack query (a forward pass of one population sample) per image, in
# attack iterations: the cpu scale's A5 (100 images, population 50, 100
# iterations) took 299 and 443 s on ResNet20 and 892 and 998 s on
# En2ResNet20 (stage_seconds of results/cpu/runs/table{1,2}), 2.3x and 2.5x
# what a third of an iteration (a forward pass alone) predicts.
_NATTACK_QUERY_COST = 0.8


def model_cost(depth: int, ensemble_size: int) -> float:
  """A training step of EnResNet``depth`` with ``ensemble_size`` members in
  ResNet20 steps, as the estimates scale them (the reference machine's
  ratios)."""
  m = _MEMBERS.get(ensemble_size, 1.5 * ensemble_size)
  return m * (depth - 2) / 18


def estimate_seconds(run: Run, only: list[ExtraEvalRun] | None = None,
                     epochs_done: int = 0,
                     step_times: StepTimes = REFERENCE_STEP_TIMES,
                     main_eval: bool = False) -> float:
  """A rough wall-time estimate of ``run`` (``only``: of these extra
  evaluations alone, and of the main one if ``main_eval``;
  ``epochs_done``: what is left after that many epochs
  of its training) on a machine with these ResNet20 ``step_times`` (default:
  the reference machine's, 2 idle CPU cores). Evaluation scales with the
  attack iteration's time, compilation with the clean step's."""
  reference = REFERENCE_STEP_TIMES
  eval_iter_per_image = _EVAL_ITER_PER_IMAGE * (
      step_times.attack_iteration / reference.attack_iteration)
  c = run.config
  m = model_cost(c.model.depth, c.model.ensemble_size)
  k = c.attack.num_steps if c.training.adversarial else 0
  n_train = scales_lib.train_size(c)
  steps = scales_lib.steps_per_epoch(n_train, c) * c.training.num_epochs
  batch_scale = c.training.batch_size / 128
  train = steps * batch_scale * m * (step_times.clean_step
                                     + k * step_times.attack_iteration)
  n_val = c.validation.num_examples or c.dataset.val_size
  train += (c.training.num_epochs * n_val * m * eval_iter_per_image
            * (1 + c.validation.attack_steps))
  train *= max(0.0, 1.0 - epochs_done / c.training.num_epochs)

  def eval_cost(cfg):
    n = cfg.eval.num_examples or 10000
    if cfg.eval.get("protocol") == "strong":
      # APGD-CE + APGD-DLR (+ APGD-T per target), each num_iters + 1
      # gradients of eot_samples draws and a check of check_draws forward
      # passes (a third of a gradient each) per iteration; sanity checks
      # not counted. Every attack is costed on every image: an upper bound,
      # as APGD-T attacks only the images the others (and its earlier
      # targets) left robust, which no estimate knows before the run.
      st = cfg.eval.strong
      noisy = bool(cfg.model.noise_coef)
      eot = (st.eot_samples or 20) if noisy else 1
      attacks = 2 + (st.num_targets if st.targeted else 0)
      per_image = attacks * (st.num_iters + 1) * (eot + (1 if noisy else 0))
      if noisy:
        per_image *= _NOISY_EOT_COST
      return n * st.num_seeds * m * eval_iter_per_image * per_image
    total = 0.0
    for name in cfg.eval.attacks.split(","):
      if name == "nattack":
        total += (n * cfg.eval.nattack_iters * cfg.eval.nattack_population
                  * m * eval_iter_per_image * _NATTACK_QUERY_COST)
      else:
        total += n * m * eval_iter_per_image * _EVAL_ITERS[name]
    return total
  if only is not None:
    return (sum(eval_cost(runs_lib.with_overrides(c, e.overrides))
                for e in only) + (eval_cost(c) if main_eval else 0.0))
  # About a minute of compiling per ResNet20-sized program set.
  compile_seconds = 60 * m * step_times.clean_step / reference.clean_step
  total = train + eval_cost(c) + compile_seconds
  for e in run.extra_evals:
    total += eval_cost(runs_lib.with_overrides(c, e.overrides))
  return total


def from_scratch_seconds(tables: Mapping[str, Iterable[str] | None],
                         scale: scales_lib.Scale, *,
                         seeds: int | None = None,
                         step_times: StepTimes = REFERENCE_STEP_TIMES,
                         step_times_of: Callable[[Run], StepTimes] | None
                         = None) -> dict[str, float]:
  """Per table (name -> its rows, None: all), the estimated seconds of its
  runs as if none had run (``seeds``: per row, default the table's),
  counting only the runs that no table before it in ``tables`` has: what
  docs/reproduction.md tabulates. Reads no file. ``step_times_of``: each
  run's step times, instead of ``step_times`` for all."""
  seen: set[str] = set()
  out = {}
  for name, rows in tables.items():
    total = 0.0
    for run in plan_lib.plan(tables_lib.TABLES[name], scale,
                             rows=rows or None, seeds=seeds):
      if run.key not in seen:
        seen.add(run.key)
        total += estimate_seconds(run, step_times=(
            step_times_of(run) if step_times_of else step_times))
    out[name] = total
  return out


def format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
