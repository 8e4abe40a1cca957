"""The training loop of a single run (``fkjax.training.train``) and of a sweep of runs
stepped as one program (``fkjax.training.sweep``): one loop, two kinds of runs.

``train(runs)`` logs the start, restores or initialises the state, and then
per epoch runs the steps (:func:`fkjax.training.epoch_steps.run_epoch_steps`), ends
the epoch (the sparsifier's projection), checks the loss of the weights
about to be saved, validates, logs one record per run and saves every run's
checkpoint with the validation accuracy that selects its best; at the end
it evaluates every run's best checkpoint on the test split.

What differs between one run and N runs (the step program, where states
and batches live, how validation is computed, messages) is a
:class:`Runs` implementation: ``fkjax.training.train.SingleRun`` and
``fkjax.training.sweep.loop.SweepRuns``.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import os
import time
from typing import Any, Iterable, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax.training import dispatch
from fkjax.training import epoch_steps
from fkjax.evaluation import run as eval_run
from fkjax.training import experiment as experiment_lib
from fkjax.workdir import metric_logging
from fkjax.config import record as run_config

PyTree = Any


def selection_column(config: ml_collections.ConfigDict) -> str:
  """The validation attack whose accuracy selects the best checkpoint
  (``config.validation.select_by``): ``"natural"`` or ``"pgd<k>"``."""
  if config.validation.select_by == "natural":
    return "natural"
  return f"pgd{config.validation.attack_steps}"


def epoch_summary(*, epoch: int, learning_rate: float,
                  train_sums: Mapping[str, float], steps: int,
                  val_accuracy: Mapping[str, float],
                  report: Any, train_seconds: float,
                  images_per_second: float | None,
                  val_seconds: float) -> dict[str, Any]:
  """One run's record of an epoch (a line of ``metrics.jsonl``).

  Args:
    epoch: the epoch, from 1.
    learning_rate: of the epoch's last step.
    train_sums: the per-step training metrics, summed over ``steps``.
    steps: the steps summed (0 is taken as 1).
    val_accuracy: ``{attack name: accuracy (%)}``.
    report: the evaluated weights' :class:`fkjax.sparsity` report.
    train_seconds: the epoch's training time, projection included.
    images_per_second: the steps' throughput after the first dispatch (in
      global batches: every process's images).
    val_seconds: the validation's wall time, as the loop measures it around
      ``Runs.validate`` (a sweep's, shared by its runs).
  """
  steps = max(1, steps)
  return {
      "epoch": epoch,
      "learning_rate": learning_rate,
      **{f"train_{k}": v / steps for k, v in train_sums.items()},
      **{f"val_{name}_accuracy": a for name, a in val_accuracy.items()},
      "weight_sparsity": report.weight_sparsity,
      "channel_sparsity": report.channel_sparsity,
      "train_seconds": train_seconds,
      "train_images_per_second": images_per_second,
      "val_seconds": val_seconds,
  }


def check_resumable(configs: Sequence[ml_collections.ConfigDict],
                    workdirs: Sequence[str]) -> None:
  """Raises ConfigError where a workdir holds checkpoints of another run."""
  for config, workdir in zip(configs, workdirs):
    if ckpt_lib.has_checkpoints(workdir):
      run_config.check_same_run(config, workdir)


class Runs(abc.ABC):
  """The runs that one :func:`train` steps together, each with its own
  config, workdir, experiment, metric logger and checkpointer.

  The abstract methods are what one run and a sweep do differently; a
  state (and the evaluated variables) is whatever the implementation's
  step program takes: a single run's state dict, or a sweep's with a
  leading run axis.
  """

  def __init__(self, configs: Sequence[ml_collections.ConfigDict],
               workdirs: Sequence[str],
               exps: Sequence[experiment_lib.Experiment]):
    self.configs, self.workdirs, self.exps = (list(configs), list(workdirs),
                                              list(exps))
    for workdir in self.workdirs:
      os.makedirs(workdir, exist_ok=True)
    enabled = jax.process_index() == 0
    self.loggers = [metric_logging.MetricLogger(w, enabled=enabled)
                    for w in self.workdirs]
    self.checkpointers = [ckpt_lib.Checkpointer(w) for w in self.workdirs]

  @property
  def size(self) -> int:
    return len(self.configs)

  @property
  def template(self) -> ml_collections.ConfigDict:
    """The settings the runs share (they differ in traced values only)."""
    return self.configs[0]

  def say(self, text: str) -> None:
    """A line of the whole loop's log (the first run's)."""
    self.loggers[0].log_text(text)

  # ------------------------------------------------ what the kinds differ in

  @abc.abstractmethod
  def describe_devices(self) -> str:
    """The log's ``devices:`` line, after the colon."""

  def setup_lines(self) -> list[str]:
    """Lines logged after the model's, before the state is restored."""
    return []

  @abc.abstractmethod
  def restore_or_init(self) -> PyTree:
    """The latest checkpoint's state (saying so), else the initial one."""

  @abc.abstractmethod
  def program(self, train_input: dispatch.TrainInput
              ) -> dispatch.StepProgram:
    """The step program on ``train_input``'s feeds."""

  @abc.abstractmethod
  def feeds(self, train_input: dispatch.TrainInput, epoch: int
            ) -> Iterable[Any]:
    """The epoch's feeds of :meth:`program`."""

  @abc.abstractmethod
  def epoch_end(self, state: PyTree) -> tuple[PyTree, PyTree]:
    """``(state, evaluated variables)`` after ``train.end_of_epoch``."""

  @abc.abstractmethod
  def step_of(self, state: PyTree) -> int:
    """The global step ``state`` is at."""

  @abc.abstractmethod
  def weights_loss(self, evaluated: PyTree, split: data_lib.Split
                   ) -> Sequence[float]:
    """Every run's clean loss on the first validation batch."""

  @abc.abstractmethod
  def validate(self, evaluated: PyTree, split: data_lib.Split, epoch: int
               ) -> list[dict[str, float]]:
    """Every run's ``{attack name: accuracy (%)}``, in the order of
    :func:`fkjax.evaluation.run.validation_attacks`."""

  @abc.abstractmethod
  def per_run(self, evaluated: PyTree) -> list[PyTree]:
    """The evaluated variables, one run's at a time."""

  @abc.abstractmethod
  def save(self, step: int, state: PyTree,
           val_accuracy: Sequence[float] | None = None) -> None:
    """Every run's checkpoint of ``step`` (with its selection accuracy)."""

  @abc.abstractmethod
  def divergence(self, run: int, value: float, bound: float,
                 where: str) -> Exception:
    """The error that stops a run whose loss ``value`` is not finite or
    above ``bound``."""

  progress_label = ""   # after "epoch e/E" in the progress display

  def line_prefix(self, run: int) -> str:
    """What starts run ``run``'s epoch line."""
    del run
    return ""

  def summary_extra(self, images_per_second: float | None
                    ) -> dict[str, Any]:
    """Keys appended to every run's epoch record."""
    del images_per_second
    return {}

  # --------------------------------------------------------------- shared

  def check_loss(self, values: Sequence[float], bound: float,
                 where: str) -> None:
    """Stops the loop before anything of a diverged run is saved."""
    for i, value in enumerate(
        np.asarray(values, np.float64).reshape(self.size)):
      value = float(value)
      if not (math.isfinite(value) and value <= bound):
        raise self.divergence(i, value, bound, where)

  def close(self) -> None:
    for checkpointer in self.checkpointers:
      checkpointer.close()


@dataclasses.dataclass
class _Loop:
  """What every epoch of :func:`train` uses."""
  runs: Runs
  train_input: dispatch.TrainInput
  steps_per_dispatch: int
  program: dispatch.StepProgram
  val_split: data_lib.Split
  max_loss: float
  schedules: list[Any]   # every run's learning rate schedule
  synthetic: str   # the tag of an epoch line on synthetic data


def train(runs: Runs) -> list[dict[str, Any]]:
  """Trains (or resumes) ``runs`` and evaluates every run's best checkpoint.

  Returns:
    Per run, ``{"validation": the last epoch's record, "test": the final
    evaluation}`` (``"test"`` where ``config.eval.final_attacks`` is set).
  """
  loop, state = _start(runs)
  t = runs.template.training
  spe = runs.exps[0].steps_per_epoch
  summaries: list[dict[str, Any]] = [{} for _ in runs.configs]
  for epoch in range(runs.step_of(state) // spe, t.num_epochs):
    state, summaries = _epoch(loop, state, epoch)
    if runs.step_of(state) >= t.num_epochs * spe:
      break
  return _final_evaluations(runs, summaries)


def _start(runs: Runs) -> tuple[_Loop, PyTree]:
  """Logs the start, restores or initialises the state, records the
  configs and builds the step program."""
  config, exp = runs.template, runs.exps[0]
  runs.say(f"data: {exp.dataset.description}")
  runs.say(f"devices: {runs.describe_devices()}")
  runs.say(f"model: "
           f"{experiment_lib.describe_model(config, exp.abstract_state())}")
  for line in runs.setup_lines():
    runs.say(line)
  state = runs.restore_or_init()
  if jax.process_index() == 0:
    # Written once the run is known to start: a command that failed at
    # start-up leaves no record that would refuse its corrected version.
    for c, w in zip(runs.configs, runs.workdirs):
      run_config.save(c, w)
  train_input = dispatch.TrainInput.build(config, exp.dataset.train)
  steps_per_dispatch = dispatch.resolve_steps_per_dispatch(config)
  runs.say("training: " + dispatch.describe(train_input.pipeline,
                                            steps_per_dispatch, config))
  val_split = eval_run.limit(
      exp.dataset.test if config.validation.split == "test"
      else exp.dataset.val, config.validation.num_examples)
  loop = _Loop(runs, train_input, steps_per_dispatch,
               runs.program(train_input), val_split,
               max_loss=float(config.training.get("max_loss") or math.inf),
               schedules=[experiment_lib.learning_rate_schedule(
                   c, exp.steps_per_epoch) for c in runs.configs],
               synthetic=(" [SYNTHETIC DATA]" if exp.dataset.is_synthetic
                          else ""))
  return loop, state


def _train_steps(loop: _Loop, state: PyTree, epoch: int
                 ) -> tuple[epoch_steps.EpochSteps, list[dict[str, float]]]:
  """The rest of the epoch's steps, and every run's sums of their
  metrics."""
  runs, config = loop.runs, loop.runs.template
  t = config.training
  spe = runs.exps[0].steps_per_epoch
  sums: list[dict[str, float]] = [{} for _ in range(runs.size)]

  def on_metrics(step, metrics):
    per_run = {k: np.asarray(v).reshape(runs.size)
               for k, v in metrics.items()}
    runs.check_loss(per_run["loss"], loop.max_loss,
                    f"at step {step} (epoch {epoch + 1})")
    for k, v in per_run.items():
      for run_sums, value in zip(sums, v):
        run_sums[k] = run_sums.get(k, 0.0) + float(value)
    return {k: f"{float(np.mean(v)):.3f}" for k, v in per_run.items()}

  ran = epoch_steps.run_epoch_steps(
      state, runs.feeds(loop.train_input, epoch), first_step=epoch * spe,
      # steps of this epoch already done (resuming from a mid-epoch save)
      skip=runs.step_of(state) - epoch * spe, steps_per_epoch=spe,
      step_fn=loop.program, on_metrics=on_metrics, save=runs.save,
      checkpoint_every=t.checkpoint_every_steps,
      desc=(f"epoch {epoch + 1}/{t.num_epochs}{runs.progress_label}"
            f"{loop.synthetic}"), progress=config.progress,
      steps_per_dispatch=loop.steps_per_dispatch,
      scan_limit=loop.train_input.scan_limit)
  return ran, sums


def _epoch(loop: _Loop, state: PyTree, epoch: int
           ) -> tuple[PyTree, list[dict[str, Any]]]:
  """One epoch: steps, projection, checks, validation, records, saves."""
  runs = loop.runs
  epoch_start = time.perf_counter()
  ran, sums = _train_steps(loop, state, epoch)
  state, evaluated = runs.epoch_end(ran.state)
  train_seconds = time.perf_counter() - epoch_start
  step = runs.step_of(state)
  # The loss of a step is taken before its update: a step that blows the
  # weights up shows only in the next one. Check the weights about to be
  # saved, so that a checkpoint is never a diverged model.
  runs.check_loss(runs.weights_loss(evaluated, loop.val_split),
                  loop.max_loss, f"of the weights after epoch {epoch + 1}")
  val_start = time.perf_counter()
  val_accuracy = runs.validate(evaluated, loop.val_split, epoch)
  val_seconds = time.perf_counter() - val_start
  rate = ran.images_per_second(runs.template.training.batch_size)
  summaries = []
  for i, (config, variables) in enumerate(zip(runs.configs,
                                              runs.per_run(evaluated))):
    summary = {**epoch_summary(
        epoch=epoch + 1, learning_rate=float(loop.schedules[i](step - 1)),
        train_sums=sums[i], steps=ran.steps, val_accuracy=val_accuracy[i],
        report=experiment_lib.sparsity_report(variables["params"], config),
        train_seconds=train_seconds, images_per_second=rate,
        val_seconds=val_seconds), **runs.summary_extra(rate)}
    # The epoch's line first: a kill during the save then loses no metrics
    # (a resumed run logs the epoch again; readers keep the last record).
    runs.loggers[i].write(step, summary)
    runs.loggers[i].log_text(runs.line_prefix(i)
                             + metric_logging.format_epoch(summary)
                             + loop.synthetic)
    runs.loggers[i].plot_curves()
    summaries.append(summary)
  select = selection_column(runs.template)
  runs.save(step, state, val_accuracy=[a[select] for a in val_accuracy])
  return state, summaries


def _final_evaluations(runs: Runs, summaries: Sequence[dict[str, Any]]
                       ) -> list[dict[str, Any]]:
  """Every run's test evaluation of its best checkpoint, after the last
  save."""
  runs.close()
  results = []
  for config, workdir, exp, logger, summary in zip(
      runs.configs, runs.workdirs, runs.exps, runs.loggers, summaries):
    result = {"validation": summary}
    if config.eval.final_attacks:
      result["test"] = eval_run.evaluate_checkpoint(
          config, workdir, exp=exp, attacks_csv=config.eval.final_attacks,
          plots=False, final=True, logger=logger)
    logger.close()
    results.append(result)
  return results
