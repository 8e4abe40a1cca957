"""The rows of ``benchmarks.gpu_bench``, in the order that sets defaults,
and what each is expected to cost.

:func:`plan` lists every measurement (a *row*) before any runs, the ones
that decide a default first:

1. ``precision``: the PGD step of each model in each precision (float32 vs
   tf32 vs bfloat16: ``config.precision``);
2. ``train.py``: two epochs of the paper's protocol through ``train.py`` on
   one device (``paper_run_minutes``);
3. ``sweep``: N runs as one program against one run (``python -m
   reproduce --sweep``);
4. ``roofs``: the card's matmul and copy ceilings;
5. ``clean step``: the natural training step of each model and precision
   (``python -m reproduce --dry-run --speed-from``);
6. ``variants``: the step under other XLA flags (conv layout, autotune
   level, deterministic ops), the other ``train.py`` data pipelines, the
   other ``config.kernels.conv`` choices.

:class:`Budget` runs a row only where its :func:`estimate` fits in what is
left of ``--max-seconds``; estimates come from the compile and step times
of the rows already measured (a guess only where none is like it yet).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

# Each XLA flag variant of the step: its name -> the flag (docs/performance.md).
XLA_VARIANTS = {
    "conv_nhwc": "--xla_gpu_force_conv_nhwc=true",
    "autotune_0": "--xla_gpu_autotune_level=0",
    "deterministic": "--xla_gpu_deterministic_ops=true",
}
# Seconds of a row with nothing measured like it (full size, --smoke).
GUESS_S = {"roofs": (10, 2), "step": (20, 6), "train": (90, 20),
           "sweep": (30, 8), "flags": (30, 8)}
# A Python process that imports JAX and fkjax, before its first compile.
PROCESS_S = (15, 4)


@dataclasses.dataclass(frozen=True)
class Row:
  """One measurement.

  Attributes:
    name: its name in the log, the JSON's ``rows`` and ``skipped``.
    group: what it decides (the section of :func:`plan`).
    kind: ``roofs``, ``step`` (in this process), ``flags`` (the step in a
      process with ``XLA_FLAGS``), ``train`` (``train.py``) or ``sweep``.
    model, precision, conv, attack_steps: the step's (``step``, ``flags``,
      ``sweep``).
    runs: a sweep's runs.
    variant: ``train.py``'s data pipeline (``train``), or the XLA variant's
      name (``flags``).
  """
  name: str
  group: str
  kind: str
  model: str = ""
  precision: str = ""
  conv: str = ""
  attack_steps: int = 0
  runs: int = 1
  variant: str = ""


def _step(group: str, model: str, precision: str, conv: str, k: int) -> Row:
  what = f"PGD-{k}" if k else "clean"
  return Row(f"step {model} {what} {precision} conv {conv}", group, "step",
             model, precision, conv, k)


def plan(cfg: dict[str, Any]) -> list[Row]:
  """Every row of ``cfg`` (:func:`benchmarks.gpu_bench.settings`), in the
  order they run."""
  models, precisions = cfg["models"], cfg["precisions"]
  conv, k = cfg["conv"][0], cfg["attack_steps"]
  rows = [_step("precision", m, p, conv, k) for m in models
          for p in precisions]
  variants = cfg["train_variants"]
  rows += [Row(f"train.py {v}", "train.py", "train", variant=v)
           for v in variants[:1]]
  sweep_p = cfg["sweep_precision"]
  rows += [Row(f"sweep {n} x {models[0]} {sweep_p}", "sweep", "sweep",
               models[0], sweep_p, conv, k, runs=n)
           for n in cfg["sweep_sizes"]]
  rows.append(Row("roofs", "roofs", "roofs"))
  rows += [_step("clean step", m, p, conv, 0) for m in models
           for p in precisions]
  rows += [Row(f"step {models[0]} PGD-{k} {sweep_p} XLA {v}", "variants",
               "flags", models[0], sweep_p, conv, k, variant=v)
           for v in cfg["xla_variants"]]
  rows += [Row(f"train.py {v}", "variants", "train", variant=v)
           for v in variants[1:]]
  rows += [_step("variants", m, p, c, k) for c in cfg["conv"][1:]
           for m in models for p in precisions]
  return rows


def _members(model: str) -> int:
  """Ensemble members of a ``configs/default.py`` model preset."""
  return int(model[2:model.index("resnet")]) if model.startswith("en") else 1


def _like(row: Row, steps: list[dict[str, Any]], attack: bool
          ) -> tuple[dict[str, Any] | None, float]:
  """The measured step most like ``row``'s (its model's, its precision's
  if measured, PGD or clean as ``attack``) and the factor to scale its
  times by (the ratio of ensemble members where only another model's is
  measured)."""
  pool = [s for s in steps if bool(s["attack_steps"]) == attack] or steps
  for same in (lambda s: s["model"] == row.model
               and s["precision"] == row.precision,
               lambda s: s["model"] == row.model):
    found = [s for s in pool if same(s)]
    if found:
      return found[-1], 1.0
  if not pool:
    return None, 1.0
  other = pool[-1]
  return other, _members(row.model) / _members(other["model"])


def _step_cost(s: dict[str, Any], scale: float, calls: int) -> float:
  """A step row's seconds: its compile, ``calls`` steps, and the flop
  count's two lowerings (a tenth of a compile each, roughly)."""
  return scale * (1.2 * s["compile_s"] + calls * s["step_ms_median"] / 1e3)


def estimate(row: Row, cfg: dict[str, Any], result: dict[str, Any]
             ) -> tuple[float, str]:
  """``(seconds, basis)``: what ``row`` should take, from the rows in
  ``result`` already measured; a guess (``GUESS_S``) where none is like
  it."""
  smoke = 1 if cfg["smoke"] else 0
  calls = cfg["repeats"] + cfg["warmup"]
  steps = result["steps"]
  guess = (float(GUESS_S[row.kind][smoke]), "a guess: nothing like it "
           "measured yet")
  if row.kind == "roofs":
    return guess
  if row.kind in ("step", "flags", "sweep"):
    s, scale = _like(row, steps, attack=bool(row.attack_steps))
    if s is None:
      return guess
    basis = f"from {s['model']} {s['precision']}'s step"
    if row.kind == "step":
      return _step_cost(s, scale, calls), basis
    if row.kind == "flags":
      return PROCESS_S[smoke] + _step_cost(s, scale, calls), basis
    # N runs: a larger program, N times the work per step
    return (scale * (2 * s["compile_s"] + calls * row.runs
                     * s["step_ms_median"] / 1e3), basis)
  # train.py: as long as the last train.py measured, else from its step
  if result["epochs"]:
    return result["epochs"][-1]["wall_s"], "from the last train.py run"
  train = cfg["train_step"]   # the model, precision, steps an epoch...
  s, scale = _like(Row("", "", "step", train["model"], train["precision"],
                       attack_steps=1), steps, attack=True)
  if s is None:
    return guess
  step_s = scale * s["step_ms_median"] / 1e3 * (
      train["batch_size"] / s["batch_size"])
  # two epochs; the validation's PGD-k on its images; ~4 programs compiled
  epoch = step_s * (train["steps_per_epoch"] + train["val_batches"]
                    * (train["val_attack_steps"] + 1)
                    / (s["attack_steps"] + 2))
  return (PROCESS_S[smoke] + 4 * scale * s["compile_s"] + 2 * epoch,
          f"from {s['model']} {s['precision']}'s step")


class Budget:
  """Runs rows while ``max_seconds`` last: a row starts only where its
  estimate fits; what does not, or fails, is said in the log and kept
  under ``skipped``; every row's outcome is appended to ``rows``.

  Args:
    max_seconds: the budget.
    log: a line to the log.
    skipped: ``{row name: why}``, filled.
    rows: ``[{"name", "group", "status", "estimate_s", "wall_s"}]``,
      filled in the order the rows come; ``status``: ``measured``,
      ``skipped``, ``failed``, or ``stopped`` (the run stopped during it).
    clock: seconds (``time.monotonic``).
  """

  def __init__(self, max_seconds: float, log: Callable[[str], None],
               skipped: dict[str, str], rows: list[dict[str, Any]],
               clock: Callable[[], float] = time.monotonic):
    self.clock = clock
    self.deadline = clock() + max_seconds
    self.log, self.skipped, self.rows = log, skipped, rows

  def left(self) -> float:
    return self.deadline - self.clock()

  def run(self, row: Row, estimated: tuple[float, str],
          fn: Callable[[], Any]) -> Any:
    """``fn()``, or None where ``estimated`` does not fit or it failed
    (one failed measurement keeps the others)."""
    seconds, basis = estimated
    record = {"name": row.name, "group": row.group,
              "estimate_s": seconds, "wall_s": None}
    self.rows.append(record)
    if self.left() < seconds:
      record["status"] = "skipped"
      self.skipped[row.name] = (
          f"not run: {max(self.left(), 0):.0f} s of --max-seconds left, "
          f"it needs ~{seconds:.0f} s ({basis})")
      self.log(f"{row.name}: skipped ({self.skipped[row.name]})")
      return None
    start = self.clock()
    record["status"] = "stopped"   # unless it ends (Ctrl-C, SIGTERM)
    try:
      out = fn()
    except Exception as e:  # pylint: disable=broad-except
      record["status"] = "failed"
      self.skipped[row.name] = f"failed: {type(e).__name__}: {e}"[:500]
      self.log(f"{row.name}: {self.skipped[row.name]}")
      return None
    finally:
      record["wall_s"] = self.clock() - start
    record["status"] = "measured" if out else "failed"
    return out
