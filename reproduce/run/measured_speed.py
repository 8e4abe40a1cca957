"""Dry-run estimates from a measured GPU: ``--dry-run --speed-from=JSON``.

``python -m benchmarks.gpu_bench`` writes, among its figures, the ms of a
PGD-k and of a clean training step of each model it measured
(``steps``). :meth:`MeasuredSpeed.step_times` turns them into the
:class:`reproduce.run.estimate.StepTimes` that
:func:`reproduce.run.estimate.estimate_seconds` scales by a run's steps,
epochs, batch size, attack iterations and evaluations: for a run whose model
was measured, from that model's steps; for another, from ResNet20's (or the
first model measured) scaled by the estimates' own model ratios
(:func:`reproduce.run.estimate.model_cost`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from fkjax import readback
from fkjax.readback import NUMBER, ListOf
from reproduce.run import estimate as estimate_lib

# The batch size the StepTimes are of (estimate.estimate_seconds scales
# them).
_STEP_TIMES_BATCH = 128

# What gpu_bench's JSON holds, as the estimates read it (a row that failed
# has no time).
_SHAPE = {"steps": ListOf({"depth": int, "ensemble_size": int,
                           "batch_size": int,
                           "step_ms_median?": NUMBER,
                           "attack_steps?": int, "precision?": str,
                           "conv?": str}),
          "environment?": dict, "settings?": dict}


@dataclasses.dataclass(frozen=True)
class MeasuredSpeed:
  """The training steps of one ``gpu_bench`` JSON.

  Attributes:
    path: the JSON read.
    environment: its ``environment`` (device, versions, date, commit).
    smoke: whether it is a ``--smoke`` run (tiny models on a CPU).
    steps: its step rows measured with training steps (PGD) or clean.
  """
  path: str
  environment: dict[str, Any]
  smoke: bool
  steps: tuple[dict[str, Any], ...]

  @classmethod
  def load(cls, path: str) -> "MeasuredSpeed":
    """Reads ``path``.

    Raises:
      ValueError: the file is missing, not JSON, or holds no PGD step.
    """
    try:
      data = readback.read_json(path, _SHAPE, missing_ok=False,
                                what="a gpu_bench measurement")
    except OSError as e:
      raise ValueError(f"--speed-from={path}: cannot read it "
                       f"({e.strerror or e}); python -m benchmarks.gpu_bench "
                       "writes one") from e
    except readback.DamagedFileError as e:
      raise ValueError(f"--speed-from={e}") from e
    steps = tuple(r for r in data["steps"]
                  if r.get("step_ms_median") and r["batch_size"] > 0)
    if not any(r.get("attack_steps") for r in steps):
      raise ValueError(f"--speed-from={path}: no PGD training step measured "
                       "in it (its 'steps'); python -m benchmarks.gpu_bench "
                       "writes them")
    return cls(path, dict(data.get("environment") or {}),
               bool((data.get("settings") or {}).get("smoke")), steps)

  def describe(self) -> str:
    """E.g. ``NVIDIA H100 80GB HBM3, measured 2026-12-06 (jax 0.10.2,
    commit 1a2b3c4) in benchmarks/results/gpu_latest.json``."""
    env = self.environment
    commit = (env.get("commit") or "?")[:7]
    smoke = "; a --smoke run: tiny models" if self.smoke else ""
    return (f"{env.get('device_kind', '?')}, measured "
            f"{str(env.get('date', '?'))[:10]} (jax {env.get('jax', '?')}, "
            f"commit {commit}{smoke}) in {self.path}")

  def _rows_for(self, config: ml_collections.ConfigDict
                ) -> list[dict[str, Any]]:
    """The rows of ``config``'s precision (else float32, else any), of the
    conv choice ``auto`` (else the first measured)."""
    precision = config.get("precision", "float32")
    rows = list(self.steps)
    for wanted in (precision, "float32"):
      same = [r for r in rows if r.get("precision") == wanted]
      if same:
        rows = same
        break
    convs = [r.get("conv") for r in rows]
    conv = "auto" if "auto" in convs else convs[0]
    return [r for r in rows if r.get("conv") == conv]

  def step_times(self, config: ml_collections.ConfigDict
                 ) -> estimate_lib.StepTimes:
    """ResNet20-equivalent step times at batch 128 for a run of ``config``
    (its model's own when measured: see the module docstring)."""
    rows = self._rows_for(config)
    models = [(r["depth"], r["ensemble_size"]) for r in rows
              if r.get("attack_steps")]
    own = (config.model.depth, config.model.ensemble_size)
    model = own if own in models else (20, 1) if (20, 1) in models \
        else models[0]
    of_model = [r for r in rows if (r["depth"], r["ensemble_size"]) == model]
    pgd = next(r for r in of_model if r.get("attack_steps"))
    clean = next((r for r in of_model if not r.get("attack_steps")), None)
    per_batch = _STEP_TIMES_BATCH / pgd["batch_size"]
    pgd_s = pgd["step_ms_median"] / 1e3 * per_batch
    k = pgd["attack_steps"]
    reference = estimate_lib.REFERENCE_STEP_TIMES
    if clean is not None:
      clean_s = clean["step_ms_median"] / 1e3 * (
          _STEP_TIMES_BATCH / clean["batch_size"])
      # Timing noise cannot make an attack iteration free: at least a
      # quarter of a clean step (as reproduce.run.calibrate floors it).
      iteration_s = max((pgd_s - clean_s) / k, 0.25 * clean_s)
    else:
      # Split as on the reference machine.
      share = reference.clean_step / (reference.clean_step
                                       + k * reference.attack_iteration)
      clean_s, iteration_s = share * pgd_s, (1 - share) * pgd_s / k
    cost = estimate_lib.model_cost(*model)
    return estimate_lib.StepTimes(clean_step=clean_s / cost,
                                attack_iteration=iteration_s / cost)
