"""``train_sweep``: the training loop of ``fkjax.train`` for N runs at once.

Every run keeps its own workdir, written as ``train.py`` writes a single
run's (``config.json``, ``checkpoints/``, ``metrics.jsonl``,
``tensorboard/``, ``final_eval.json``), so ``eval.py --workdir=<run>`` and
every other tool read it as one. The runs step together: one jitted program
per step for all of them.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from fkjax import atomic
from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax import dispatch
from fkjax import epoch_steps
from fkjax import eval_run
from fkjax import evaluate
from fkjax import experiment as experiment_lib
from fkjax import metric_logging
from fkjax import parallel
from fkjax import run_config
from fkjax import workdir as workdir_lib
from fkjax.errors import NonFiniteLossError
from fkjax.sweep import program
from fkjax.sweep import spec
from fkjax.sweep import summary

ConfigError = spec.ConfigError
SWEEP_FILE = "sweep.json"


def train_sweep(configs: Sequence[ml_collections.ConfigDict],
                workdirs: Sequence[str | os.PathLike[str]], *,
                names: Sequence[str] | None = None,
                shard: str | None = None,
                data_order: str | None = None) -> list[dict[str, Any]]:
  """Trains (or resumes) the runs ``configs`` in ``workdirs`` as one program.

  Each workdir ends up as ``train.train_and_evaluate(config, workdir)``
  leaves it, and each run reaches the parameters of that single run (to
  float rounding; ``docs/sweeps.md``).

  Args:
    configs: the runs' configs, equal except for
      :data:`fkjax.sweep.SWEEPABLE_KEYS` (a ``sweep`` section is ignored).
    workdirs: one directory per run.
    names: the runs' names in messages; default the workdirs' base names.
    shard: ``"batch"`` (default: every batch split over the devices, the
      runs replicated) or ``"runs"`` (the runs split over the devices);
      default ``configs[0].sweep.shard`` if set.
    data_order: ``"shared"`` (default: all runs see the first run's batches,
      and record its data seed as ``training.data_seed``) or ``"per_run"``
      (each run its own seed's batches, as it would alone); default
      ``configs[0].sweep.data_order`` if set.

  Returns:
    One summary per run, as ``train.train_and_evaluate`` returns.

  Raises:
    ConfigError: runs that differ outside the sweepable keys (one line),
      two runs in one workdir, a workdir of another run, or runs that
      stopped at different steps.
  """
  configs = list(configs)
  workdirs = [os.fspath(w) for w in workdirs]
  if len(configs) != len(workdirs):
    raise ConfigError(f"a sweep of {len(configs)} configs needs as many "
                      f"workdirs, got {len(workdirs)}")
  real = [os.path.realpath(w) for w in workdirs]
  if len(set(real)) != len(real):
    twice = next(w for w, r in zip(workdirs, real) if real.count(r) > 1)
    raise ConfigError(f"two runs of the sweep share the workdir {twice}")
  shard = shard or spec.section_option(configs[0], "shard", "batch")
  data_order = data_order or spec.section_option(configs[0], "data_order",
                                                 "shared")
  configs = spec.with_data_seed([spec.without_section(c) for c in configs],
                                data_order)
  names = list(names) if names is not None else [
      os.path.basename(os.path.normpath(w)) for w in workdirs]
  spec.check_configs(configs, names)   # before any workdir is touched
  locks = []
  try:
    for w in workdirs:
      lock = workdir_lib.WorkdirLock(w)
      lock.acquire()
      locks.append(lock)
    return summary.report(configs, names, _train_sweep(
        configs, workdirs, names, shard), enabled=jax.process_index() == 0)
  finally:
    for lock in locks:
      lock.release()


def next_save(step: int, steps_per_epoch: int, every: int) -> int:
  """The first step after ``step`` whose state the loop saves."""
  candidates = [(step // steps_per_epoch + 1) * steps_per_epoch]
  if every:
    candidates.append((step // every + 1) * every)
  return min(candidates)


def resume_step(checkpointers: Sequence[ckpt_lib.Checkpointer],
                names: Sequence[str], steps_per_epoch: int, every: int
                ) -> int | None:
  """The step every run resumes from (None: from the start).

  A sweep saves its runs one after the other: a process killed in between
  leaves some runs one save ahead. They resume with the others from the
  earlier save (each keeps its latest two) and skip re-saving the step
  they hold, which the resumed sweep computes again bit for bit.

  Raises:
    ConfigError: runs further apart than one save.
  """
  latest = [c.latest_step() for c in checkpointers]
  if all(s is None for s in latest):
    return None
  common = min(s or 0 for s in latest)
  ahead = next_save(common, steps_per_epoch, every)
  for name, ckpt, s in zip(names, checkpointers, latest):
    s = s or 0
    if s == common or (s == ahead and (
        common == 0 or common in ckpt.all_steps())):
      continue
    where = ", ".join(f"{n}: {t or 0}" for n, t in zip(names, latest))
    raise ConfigError(
        f"the runs of this sweep are at different steps ({where}); a sweep "
        "resumes runs that it trained together: sweep the runs at one step "
        "together, or give the others new workdirs")
  return common or None


def _write_sweep_record(root: str, record: dict[str, Any]) -> None:
  atomic.write_json(os.path.join(root, SWEEP_FILE), record, sort_keys=True)


def train_from_config(config: ml_collections.ConfigDict, workdir: str
                      ) -> list[dict[str, Any]]:
  """``train.py`` with a ``config.sweep`` section: the runs it describes
  (:func:`fkjax.sweep.expand`) in ``workdir/<run name>/``, and
  ``workdir/sweep.json`` listing them."""
  runs = spec.expand(config)
  if not runs:
    raise ConfigError("config.sweep describes no run")
  shard = spec.section_option(config, "shard", "batch")
  data_order = spec.section_option(config, "data_order", "shared")
  workdirs = [os.path.join(workdir, name) for name, _, _ in runs]
  _write_sweep_record(workdir, {
      "runs": [{"name": name, "overrides": overrides}
               for name, overrides, _ in runs],
      "shard": shard, "data_order": data_order})
  return train_sweep([c for _, _, c in runs], workdirs,
                     names=[name for name, _, _ in runs], shard=shard,
                     data_order=data_order)


class _Runs:
  """Per-run host state: loggers, checkpointers, messages."""

  def __init__(self, configs, workdirs, names):
    self.configs, self.workdirs, self.names = configs, workdirs, names
    self.loggers = [metric_logging.MetricLogger(w) for w in workdirs]
    self.checkpointers = [ckpt_lib.Checkpointer(w) for w in workdirs]

  def check_loss(self, values: np.ndarray, bound: float, where: str) -> None:
    """Stops the sweep before anything of a diverged run is saved."""
    for i, value in enumerate(np.asarray(values, np.float64)):
      value = float(value)
      if math.isfinite(value) and value <= bound:
        continue
      last = self.checkpointers[i].latest_step()
      kept = (f"every run's last good checkpoint (step {last}) is kept"
              if last is not None else "no checkpoint was written")
      raise NonFiniteLossError(
          f"run {self.names[i]} ({self.workdirs[i]}) of the sweep diverged: "
          f"loss {value:.4g} {where} (config.training.max_loss={bound:g}); "
          f"{kept}. Lower its config.training.learning_rate, or sweep the "
          "other runs without it")

  def save(self, sweep: program.Sweep, step: int, state: Any,
           val_accuracy: Sequence[float] | None = None) -> None:
    runs = sweep.unstack(state, sweep.size)
    for i, (ckpt, run_state) in enumerate(zip(self.checkpointers, runs)):
      if step in ckpt.all_steps():
        continue  # saved before an interruption: the same state
      ckpt.save(step, parallel.replicate(run_state, sweep.mesh),
                val_accuracy=None if val_accuracy is None
                else val_accuracy[i])

  def close(self) -> None:
    for c in self.checkpointers:
      c.close()


def _validation_accuracy(sweep: program.Sweep, evaluated: Any, split,
                         val_keys: jax.Array, epoch: int, values: Any
                         ) -> np.ndarray:
  """``[runs, attacks]`` accuracies (%) of ``evaluate.Evaluator`` on the
  validation split, every run under its own keys and attack settings."""
  names = sweep.validation_names()
  correct = np.zeros((sweep.size, len(names)), np.int64)
  num_examples = 0
  for batch_index, batch in enumerate(data_lib.eval_batches(
      split, sweep.template.validation.batch_size)):
    batch = evaluate.real_rows(batch)   # padding rows never reach a model
    if batch is None:
      continue
    num_examples += len(batch["label"])
    placed = sweep.place_eval_batch(batch)
    correct += np.asarray(jax.device_get(sweep.validation_counts(
        evaluated, placed["image"], placed["label"], val_keys, epoch,
        batch_index, values)))
  return 100.0 * correct / max(num_examples, 1)


def _train_sweep(configs, workdirs, names, shard) -> list[dict[str, Any]]:
  for c, w in zip(configs, workdirs):
    if ckpt_lib.has_checkpoints(w):
      run_config.check_same_run(c, w)
  sweep = program.Sweep.build(configs, names, shard=shard)
  exp = sweep.exps[0]
  config = sweep.template
  for w in workdirs:
    os.makedirs(w, exist_ok=True)
  runs = _Runs(configs, workdirs, names)
  say = runs.loggers[0].log_text
  say(f"data: {exp.dataset.description}")
  say(f"devices: {exp.mesh.size} x {jax.devices()[0].platform}")
  say(f"model: {experiment_lib.describe_model(config, exp.abstract_state())}")
  say(f"sweep: {sweep.size} runs in one program, varying "
      f"{', '.join(sweep.varying) or 'nothing'}; shard {shard}; "
      + ("one batch stream" if sweep.shared_batch
         else "a batch stream per run"))

  t = config.training
  spe = sweep.steps_per_epoch
  start = resume_step(runs.checkpointers, names, spe,
                      t.checkpoint_every_steps)
  if start is None:
    state = sweep.initial_state()
  else:
    state = sweep.stack([
        ckpt.restore(e.abstract_state(), "latest", step=start)[1]
        for ckpt, e in zip(runs.checkpointers, sweep.exps)])
    say(f"resumed {sweep.size} runs from step {start}")
  for c, w in zip(configs, workdirs):
    run_config.save(c, w)

  values = sweep.placed_values()
  train_keys = sweep.keys("train")
  train_input = dispatch.TrainInput.build(config, exp.dataset.train)
  steps_per_dispatch = dispatch.resolve_steps_per_dispatch(config)
  say("training: " + dispatch.describe(train_input.pipeline,
                                       steps_per_dispatch, config))
  train_steps = sweep.program(train_input, train_keys, values)
  val_keys = sweep.keys("validation")
  val_split = eval_run.limit(
      exp.dataset.test if config.validation.split == "test"
      else exp.dataset.val, config.validation.num_examples)
  val_names = sweep.validation_names()
  max_loss = float(t.get("max_loss") or math.inf)
  total_steps = t.num_epochs * spe
  schedules = [experiment_lib.learning_rate_schedule(c, spe)
               for c in configs]
  data_seeds = [spec.effective_data_seed(c) for c in configs]
  synthetic = " [SYNTHETIC DATA]" if exp.dataset.is_synthetic else ""
  summaries: list[dict[str, Any]] = [{} for _ in configs]

  step_now = 0 if start is None else start
  for epoch in range(step_now // spe, t.num_epochs):
    epoch_start = time.perf_counter()

    if sweep.shared_batch:
      feeds = train_input.feeds(data_seeds[0], epoch)
    else:   # a run axis on every feed
      feeds = map(dispatch.stack, zip(*[train_input.feeds(s, epoch)
                                        for s in data_seeds]))
    skip = step_now - epoch * spe
    sums = [dict() for _ in configs]

    def on_metrics(step, metrics, epoch=epoch, sums=sums):
      runs.check_loss(metrics["loss"], max_loss,
                      f"at step {step} (epoch {epoch + 1})")
      for k, v in metrics.items():
        for i in range(sweep.size):
          sums[i][k] = sums[i].get(k, 0.0) + float(v[i])
      return {k: f"{float(np.mean(v)):.3f}" for k, v in metrics.items()}

    ran = epoch_steps.run_epoch_steps(
        state, feeds, first_step=epoch * spe, skip=skip,
        steps_per_epoch=spe, step_fn=train_steps, on_metrics=on_metrics,
        save=lambda step, state: runs.save(sweep, step, state),
        checkpoint_every=t.checkpoint_every_steps,
        desc=f"epoch {epoch + 1}/{t.num_epochs} ({sweep.size} runs)"
             f"{synthetic}", progress=config.progress,
        steps_per_dispatch=steps_per_dispatch,
        scan_limit=train_input.scan_limit)
    state, evaluated = sweep.epoch_end(ran.state, values)
    train_seconds = time.perf_counter() - epoch_start
    step_now = int(jax.device_get(state["step"])[0])

    # The loss of a step is taken before its update: check the weights
    # about to be saved, as a single run does.
    check_batch = sweep.place_eval_batch(evaluate.real_rows(next(
        data_lib.eval_batches(val_split, config.validation.batch_size))))
    runs.check_loss(jax.device_get(sweep.loss_check(
        evaluated, check_batch["image"], check_batch["label"], val_keys,
        values)), max_loss, f"of the weights after epoch {epoch + 1}")
    val_start = time.perf_counter()
    accuracy = _validation_accuracy(sweep, evaluated, val_split, val_keys,
                                    epoch, values)
    val_seconds = time.perf_counter() - val_start
    select = ("natural" if config.validation.select_by == "natural"
              else f"pgd{config.validation.attack_steps}")
    n_steps = max(1, ran.steps)
    per_run_rate = ran.images_per_second(t.batch_size)
    for i, (c, evaluated_i) in enumerate(zip(
        configs, sweep.unstack(evaluated, sweep.size))):
      report = experiment_lib.sparsity_report(evaluated_i["params"], c)
      summaries[i] = {
          "epoch": epoch + 1,
          "learning_rate": float(schedules[i](step_now - 1)),
          **{f"train_{k}": v / n_steps for k, v in sums[i].items()},
          **{f"val_{name}_accuracy": float(accuracy[i, j])
             for j, name in enumerate(val_names)},
          "weight_sparsity": report.weight_sparsity,
          "channel_sparsity": report.channel_sparsity,
          # the sweep's times, shared by its runs
          "train_seconds": train_seconds,
          "train_images_per_second": per_run_rate,
          "val_seconds": val_seconds,
          "sweep_runs": sweep.size,
          "sweep_images_per_second": (per_run_rate * sweep.size
                                      if per_run_rate else None),
      }
      runs.loggers[i].write(step_now, summaries[i])
      runs.loggers[i].log_text(
          f"[{names[i]}] "
          + metric_logging.format_epoch(summaries[i]) + synthetic)
    select_index = val_names.index(select)
    runs.save(sweep, step_now, state,
              val_accuracy=[float(a) for a in accuracy[:, select_index]])
    if step_now >= total_steps:
      break

  runs.close()
  results = []
  for i, (c, w) in enumerate(zip(configs, workdirs)):
    summary = {"validation": summaries[i]}
    if c.eval.final_attacks:
      summary["test"] = eval_run.evaluate_checkpoint(
          c, w, exp=sweep.exps[i], attacks_csv=c.eval.final_attacks,
          plots=False, final=True, logger=runs.loggers[i])
    runs.loggers[i].close()
    results.append(summary)
  return results
