"""``train_sweep``: N runs trained at once, through the single run's own
loop (:func:`fkjax.training.loop.train`) with :class:`SweepRuns`.

Every run keeps its own workdir, written as ``train.py`` writes a single
run's (``config.json``, ``checkpoints/``, ``metrics.jsonl``,
``tensorboard/``, ``final_eval.json``), so ``eval.py --workdir=<run>`` and
every other tool read it as one. The runs step together: one jitted program
per step for all of them.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from fkjax import atomic
from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax.training import dispatch
from fkjax import evaluation
from fkjax.training import parallel
from fkjax.training import loop as run_loop
from fkjax import workdir as workdir_lib
from fkjax.errors import NonFiniteLossError
from fkjax.training.sweep import program
from fkjax.training.sweep import spec
from fkjax.training.sweep import summary

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
      :data:`fkjax.training.sweep.SWEEPABLE_KEYS` (a ``sweep`` section is ignored).
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
  (:func:`fkjax.training.sweep.expand`) in ``workdir/<run name>/``, and
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


def _train_sweep(configs, workdirs, names, shard) -> list[dict[str, Any]]:
  run_loop.check_resumable(configs, workdirs)
  sweep = program.Sweep.build(configs, names, shard=shard)
  return run_loop.train(SweepRuns(sweep, workdirs))


class SweepRuns(run_loop.Runs):
  """A sweep's runs for :func:`fkjax.training.loop.train`: one state with a run
  axis, stepped by :class:`fkjax.training.sweep.program.Sweep`'s programs; each run
  saved, logged and evaluated in its own workdir."""

  def __init__(self, sweep: program.Sweep, workdirs: Sequence[str]):
    super().__init__(sweep.configs, workdirs, sweep.exps)
    self.sweep, self.names = sweep, sweep.names
    self._values = sweep.placed_values()
    self._val_keys = sweep.keys("validation")

  def describe_devices(self) -> str:
    return f"{self.sweep.mesh.size} x {jax.devices()[0].platform}"

  def setup_lines(self) -> list[str]:
    sweep = self.sweep
    return [f"sweep: {sweep.size} runs in one program, varying "
            f"{', '.join(sweep.varying) or 'nothing'}; shard {sweep.shard}; "
            + ("one batch stream" if sweep.shared_batch
               else "a batch stream per run")]

  def restore_or_init(self) -> Any:
    sweep = self.sweep
    start = resume_step(self.checkpointers, self.names,
                        sweep.steps_per_epoch,
                        self.template.training.checkpoint_every_steps)
    if start is None:
      return sweep.initial_state()
    state = sweep.stack([
        ckpt.restore(e.abstract_state(), "latest", step=start)[1]
        for ckpt, e in zip(self.checkpointers, sweep.exps)])
    self.say(f"resumed {sweep.size} runs from step {start}")
    return state

  def program(self, train_input: dispatch.TrainInput
              ) -> dispatch.StepProgram:
    return self.sweep.program(train_input, self.sweep.keys("train"),
                              self._values)

  def feeds(self, train_input: dispatch.TrainInput, epoch: int):
    seeds = [spec.effective_data_seed(c) for c in self.configs]
    if self.sweep.shared_batch:
      return train_input.feeds(seeds[0], epoch)
    # a run axis on every feed
    return map(dispatch.stack, zip(*[train_input.feeds(s, epoch)
                                     for s in seeds]))

  def epoch_end(self, state: Any) -> tuple[Any, Any]:
    return self.sweep.epoch_end(state, self._values)

  def step_of(self, state: Any) -> int:
    return int(jax.device_get(state["step"])[0])

  def weights_loss(self, evaluated: Any, split: data_lib.Split
                   ) -> np.ndarray:
    batch = self.sweep.place_eval_batch(evaluation.real_rows(next(
        data_lib.eval_batches(split, self.template.validation.batch_size))))
    return jax.device_get(self.sweep.loss_check(
        evaluated, batch["image"], batch["label"], self._val_keys,
        self._values))

  def validate(self, evaluated: Any, split: data_lib.Split, epoch: int
               ) -> list[dict[str, float]]:
    accuracy = _validation_accuracy(self.sweep, evaluated, split,
                                    self._val_keys, epoch, self._values)
    names = self.sweep.validation_names()
    return [{name: float(run[j]) for j, name in enumerate(names)}
            for run in accuracy]

  def per_run(self, evaluated: Any) -> list[Any]:
    return self.sweep.unstack(evaluated, self.sweep.size)

  def save(self, step: int, state: Any,
           val_accuracy: Sequence[float] | None = None) -> None:
    runs = self.sweep.unstack(state, self.sweep.size)
    for i, (ckpt, run_state) in enumerate(zip(self.checkpointers, runs)):
      if step in ckpt.all_steps():
        continue  # saved before an interruption: the same state
      ckpt.save(step, parallel.replicate(run_state, self.sweep.mesh),
                val_accuracy=None if val_accuracy is None
                else val_accuracy[i])

  def divergence(self, run: int, value: float, bound: float,
                 where: str) -> Exception:
    last = self.checkpointers[run].latest_step()
    kept = (f"every run's last good checkpoint (step {last}) is kept"
            if last is not None else "no checkpoint was written")
    return NonFiniteLossError(
        f"run {self.names[run]} ({self.workdirs[run]}) of the sweep "
        f"diverged: loss {value:.4g} {where} (config.training.max_loss="
        f"{bound:g}); {kept}. Lower its config.training.learning_rate, or "
        "sweep the other runs without it")

  @property
  def progress_label(self) -> str:
    return f" ({self.sweep.size} runs)"

  def line_prefix(self, run: int) -> str:
    return f"[{self.names[run]}] "

  def summary_extra(self, images_per_second: float | None
                    ) -> dict[str, Any]:
    # the sweep's times, shared by its runs
    return {"sweep_runs": self.sweep.size,
            "sweep_images_per_second": (
                images_per_second * self.sweep.size if images_per_second
                else None)}


def _validation_accuracy(sweep: program.Sweep, evaluated: Any, split,
                         val_keys: jax.Array, epoch: int, values: Any
                         ) -> np.ndarray:
  """``[runs, attacks]`` accuracies (%) of ``evaluation.Evaluator`` on the
  validation split, every run under its own keys and attack settings."""
  names = sweep.validation_names()
  correct = np.zeros((sweep.size, len(names)), np.int64)
  num_examples = 0
  for batch_index, batch in enumerate(data_lib.eval_batches(
      split, sweep.template.validation.batch_size)):
    batch = evaluation.real_rows(batch)   # padding rows never reach a model
    if batch is None:
      continue
    num_examples += len(batch["label"])
    placed = sweep.place_eval_batch(batch)
    correct += np.asarray(jax.device_get(sweep.validation_counts(
        evaluated, placed["image"], placed["label"], val_keys, epoch,
        batch_index, values)))
  return 100.0 * correct / max(num_examples, 1)
