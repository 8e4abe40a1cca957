"""PGD adversarial training with RVSM / RGSM / ADMM sparsification: the loop.

``train_and_evaluate(config, workdir)`` runs the paper's protocol, read top
to bottom in :func:`train_runs`: build the runs, restore the latest
checkpoint (or initialise), then per epoch the training steps
(:mod:`fkjax.training.step`: PGD on the batch, the loss's gradient, the
optax chain ``weight decay -> [group lasso] -> SGD (Nesterov) ->
sparsifier``), the end of the epoch (RVSM/RGSM replace ``w`` by its sparse
projection ``u``, ADMM resets its auxiliary variables; one jitted program),
the validation, the epoch's record and the checkpoint; at the end the test
evaluation of the best checkpoint. Running the same command again resumes
from the last complete checkpoint and reaches the same parameters as an
uninterrupted run.

A sweep (:mod:`fkjax.training.sweep`) is the same loop over N runs stepped
as one program on a run axis; a single run is N = 1
(:mod:`fkjax.training.program`).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import ml_collections
import numpy as np
import optax

from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax import interrupt
from fkjax import workdir as workdir_lib
from fkjax.config import record as run_config
from fkjax.errors import NonFiniteLossError
from fkjax.evaluation import run as eval_run
from fkjax.training import build
from fkjax.training import devices
from fkjax.training import input_pipeline
from fkjax.training import precision
from fkjax.training import program
from fkjax.training import sparsify
from fkjax.training import validation
from fkjax.workdir import metric_logging

PyTree = Any


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, Any]:
  """Trains (or resumes) in ``workdir`` and evaluates the best checkpoint.

  Returns:
    A summary: the last validation metrics and the test evaluation.
  """
  run_config.validate(config)
  # One writer per workdir: a second train.py on it stops here.
  lock = workdir_lib.WorkdirLock(workdir) if jax.process_index() == 0 else None
  if lock is not None:
    lock.acquire()
  try:
    return train_runs([config], [workdir])[0]
  finally:
    if lock is not None:
      lock.release()


def train_runs(configs: Sequence[ml_collections.ConfigDict],
               workdirs: Sequence[str], *,
               names: Sequence[str] | None = None, shard: str = "batch",
               sweep: bool = False) -> list[dict[str, Any]]:
  """Trains (or resumes) the runs ``configs`` in ``workdirs`` as one
  program and evaluates every run's best checkpoint.

  Args:
    configs: equal but for :data:`fkjax.training.sweep.SWEEPABLE_KEYS`.
    workdirs: one directory per run.
    names: the runs' names in messages.
    shard: ``"batch"`` or ``"runs"`` (:class:`program.Runs`).
    sweep: whether the runs are a sweep's (its log lines and record keys).

  Returns:
    Per run, ``{"validation": the last epoch's record, "test": the final
    evaluation}`` (``"test"`` where ``config.eval.final_attacks`` is set).
  """
  # Build: "auto" settings resolved for this platform, as the runs record.
  configs = [precision.resolved(c) for c in configs]
  check_resumable(configs, workdirs)
  runs = program.Runs.build(configs, names, shard=shard)
  config, exp = runs.template, runs.exps[0]
  # Closed however the loop ends: the last checkpoint's asynchronous write
  # is waited for (its failure said), the curves' last redraw too.
  with Files.open(runs, workdirs, sweep) as files:
    files.describe(runs)
    # Restore.
    start, state = runs.restore(files.checkpointers)
    files.started(start)
    train_input = input_pipeline.TrainInput.build(config, exp.dataset.train)
    files.say("training: "
              + input_pipeline.describe(train_input.pipeline, config))
    values, val_keys = runs.placed_values(), runs.keys("validation")
    step_fn = runs.step_program(train_input, runs.keys("train"), values)
    val_split = data_lib.limit(
        exp.dataset.test if config.validation.split == "test"
        else exp.dataset.val, config.validation.num_examples)
    t, spe = config.training, runs.steps_per_epoch
    summaries: list[dict[str, Any]] = [{} for _ in configs]
    # An epoch's wall time runs from the previous epoch's record to its
    # own: the steps, loss check, validation and the previous epoch's save.
    last_record = time.perf_counter()
    for epoch in range(runs.step_of(state) // spe, t.num_epochs):
      # The epoch's steps.
      epoch_start = time.perf_counter()
      ran = epoch_steps(
          state, _feeds(runs, train_input, epoch), first_step=epoch * spe,
          # steps of this epoch already done (resuming from a mid-epoch save)
          skip=runs.step_of(state) - epoch * spe, steps_per_epoch=spe,
          step_fn=step_fn, on_metrics=files.metrics_adder(epoch),
          save=lambda step, state: runs.save(files.checkpointers, step,
                                             state),
          checkpoint_every=t.checkpoint_every_steps,
          desc=(f"epoch {epoch + 1}/{t.num_epochs}"
                + (f" ({runs.size} runs)" if sweep else "")
                + files.synthetic),
          progress=config.progress)
      # The end of the epoch: w <- u (RVSM/RGSM), ADMM's reset.
      state, evaluated = runs.end_of_epoch(ran.state, values)
      train_seconds = time.perf_counter() - epoch_start
      step = runs.step_of(state)
      # The loss of a step is taken before its update: a step that blows the
      # weights up shows only in the next one. Check the weights about to be
      # saved, so that a checkpoint is never a diverged model.
      files.check_loss(
          runs.weights_loss(evaluated, val_split, val_keys, values),
          f"of the weights after epoch {epoch + 1}")
      # Validation.
      val_start = time.perf_counter()
      val_accuracy = runs.validate(evaluated, val_split, val_keys, epoch,
                                   values)
      val_seconds = time.perf_counter() - val_start
      # The epoch's records, then the checkpoints (written in the
      # background while the next epoch trains).
      now = time.perf_counter()
      epoch_seconds, last_record = now - last_record, now
      summaries = files.write_records(
          step, runs.unstack(evaluated), epoch=epoch,
          sums=files.sums, steps=ran.steps, val_accuracy=val_accuracy,
          train_seconds=train_seconds, val_seconds=val_seconds,
          epoch_seconds=epoch_seconds,
          images_per_second=ran.images_per_second(t.batch_size))
      select = validation.selection_column(config)
      runs.save(files.checkpointers, step, state,
                val_accuracy=[a[select] for a in val_accuracy])
      if step >= t.num_epochs * spe:
        break
    # The final evaluation of every run's best checkpoint.
    return files.final_evaluations(runs, summaries)


def check_resumable(configs: Sequence[ml_collections.ConfigDict],
                    workdirs: Sequence[str]) -> None:
  """Raises ConfigError where a workdir holds checkpoints of another run."""
  for config, workdir in zip(configs, workdirs):
    if ckpt_lib.has_checkpoints(workdir):
      run_config.check_same_run(config, workdir)


def _feeds(runs: program.Runs, train_input: input_pipeline.TrainInput,
           epoch: int) -> Iterable[Any]:
  """The epoch's feeds of the step program: one stream shared by the runs,
  or (a data seed per run) every run's stacked on a run axis."""
  seeds = [build.data_seed(c) for c in runs.configs]
  if runs.shared_batch:
    return train_input.feeds(seeds[0], epoch)
  return map(input_pipeline.stack, zip(*[train_input.feeds(s, epoch)
                                         for s in seeds]))


@dataclasses.dataclass
class EpochSteps:
  """What the steps of an epoch leave.

  Attributes:
    state: the training state after the last step.
    steps: steps run by this call (a resumed epoch's skipped ones excluded).
    steady_seconds: wall time from reading the first step's metrics to the
      end (compilation excluded); None with a single step.
    steady_steps: the steps run in ``steady_seconds``.
  """
  state: PyTree
  steps: int
  steady_seconds: float | None
  steady_steps: int = 0

  def images_per_second(self, batch_size: int) -> float | None:
    """Throughput after the first step, in images of ``batch_size``."""
    if not self.steady_seconds:
      return None
    return self.steady_steps * batch_size / self.steady_seconds


def epoch_steps(state: PyTree, feeds: Iterable[Any], *, first_step: int,
                skip: int, steps_per_epoch: int,
                step_fn: Callable[[PyTree, Any, int], tuple[PyTree, Any]],
                on_metrics: Callable[[int, Any], Mapping[str, str]],
                save: Callable[[int, PyTree], None], checkpoint_every: int,
                desc: str, progress: bool) -> EpochSteps:
  """Runs ``step_fn`` over ``feeds``, the rest of one epoch, one step per
  dispatch.

  A step's metrics are read one step late, so that the host prepares the
  next batch while the device still runs this step (reading them at once
  would wait for the device every step); progress is reported here, on the
  host, between dispatches.

  Args:
    state: the training state.
    feeds: the epoch's feeds (batches, or plans of them), all of them (the
      first ``skip`` are dropped).
    first_step: the global step of the epoch's first feed.
    skip: steps of this epoch done before (resuming mid-epoch).
    steps_per_epoch: steps of a whole epoch.
    step_fn: ``(state, feed, step) -> (state, metrics)``.
    on_metrics: called with ``(step, metrics on the host)`` for every step,
      one step late; checks the loss (raising stops the epoch) and returns
      the progress bar's postfix.
    save: ``(step, state)``, a mid-epoch checkpoint.
    checkpoint_every: steps between mid-epoch checkpoints; 0: none.
    desc: the progress bar's label.
    progress: whether to show progress (see
      :func:`fkjax.workdir.metric_logging.progress`).
  """
  bar = metric_logging.progress(
      None, total=steps_per_epoch, initial=skip, desc=desc, unit="step",
      disable=not progress, leave=False)
  consumed = steady_from = 0
  first_done = None

  def consume(step: int, metrics: Any) -> None:
    nonlocal consumed, first_done, steady_from
    postfix = on_metrics(step, jax.device_get(metrics))
    consumed += 1
    if first_done is None:
      first_done, steady_from = time.perf_counter(), consumed
    bar.set_postfix(postfix)
    bar.update(1)

  pending = None
  for done, feed in enumerate(
      itertools.islice(feeds, skip, steps_per_epoch), start=skip + 1):
    interrupt.check()  # a Ctrl-C that library code caught stops here
    step = first_step + done - 1
    state, metrics = step_fn(state, feed, step)
    if pending is not None:
      consume(*pending)
    pending = (step, metrics)
    if (checkpoint_every and (step + 1) % checkpoint_every == 0
        and done < steps_per_epoch):
      consume(*pending)   # never checkpoint a state with a non-finite loss
      pending = None
      save(step + 1, state)
  if pending is not None:
    consume(*pending)
  bar.close()
  steady = (time.perf_counter() - first_done
            if consumed > steady_from else None)
  return EpochSteps(state, consumed, steady, consumed - steady_from)


def epoch_summary(*, epoch: int, learning_rate: float,
                  train_sums: Mapping[str, float], steps: int,
                  val_accuracy: Mapping[str, float],
                  report: Any, train_seconds: float,
                  images_per_second: float | None,
                  val_seconds: float, epoch_seconds: float
                  ) -> dict[str, Any]:
  """One run's record of an epoch (a line of ``metrics.jsonl``).

  Args:
    epoch: the epoch, from 1.
    learning_rate: of the epoch's last step.
    train_sums: the per-step training metrics, summed over ``steps``.
    steps: the steps summed (0 is taken as 1).
    val_accuracy: ``{attack name: accuracy (%)}``.
    report: the evaluated weights' :class:`fkjax.sparsity` report.
    train_seconds: the epoch's training time, projection included.
    images_per_second: the steps' throughput after the first step (in
      global batches: every process's images).
    val_seconds: the validation's wall time (a sweep's, shared by its runs).
    epoch_seconds: the epoch's wall time, from the previous epoch's record
      (or the loop's start in this process) to this one: its steps, the
      end of the epoch, the loss check, the validation, and the previous
      epoch's checkpoint save (its part that the loop waits for).
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
      "epoch_seconds": epoch_seconds,
  }


@dataclasses.dataclass
class Files:
  """Every run's workdir, metric logger and checkpointer, and what the
  loop writes there: log lines, epoch records, loss checks' errors, the
  final evaluation.

  Attributes:
    configs, workdirs, names: the runs'.
    loggers: one :class:`fkjax.workdir.metric_logging.MetricLogger` a run;
      the first run's log holds the loop's own lines.
    checkpointers: one :class:`fkjax.checkpoint.Checkpointer` a run.
    sweep: whether the runs are a sweep's: its lines name the run, its
      records hold ``sweep_runs`` and ``sweep_images_per_second``.
    synthetic: the tag of an epoch line on synthetic data.
    max_loss: ``config.training.max_loss`` (inf where unset).
    schedules: every run's learning rate schedule.
    sums: every run's sums of the epoch's step metrics so far.
  """
  configs: list[ml_collections.ConfigDict]
  workdirs: list[str]
  names: list[str]
  loggers: list[metric_logging.MetricLogger]
  checkpointers: list[ckpt_lib.Checkpointer]
  sweep: bool
  synthetic: str
  max_loss: float
  schedules: list[optax.Schedule]
  sums: list[dict[str, float]] = dataclasses.field(default_factory=list)

  @classmethod
  def open(cls, runs: program.Runs, workdirs: Sequence[str], sweep: bool
           ) -> "Files":
    workdirs = list(workdirs)
    for workdir in workdirs:
      os.makedirs(workdir, exist_ok=True)
    enabled = jax.process_index() == 0
    return cls(list(runs.configs), workdirs, list(runs.names),
               [metric_logging.MetricLogger(w, enabled=enabled)
                for w in workdirs],
               [ckpt_lib.Checkpointer(w, asynchronous=True)
                for w in workdirs], sweep,
               " [SYNTHETIC DATA]" if runs.exps[0].dataset.is_synthetic
               else "",
               float(runs.template.training.get("max_loss") or math.inf),
               [build.learning_rate_schedule(c, runs.steps_per_epoch)
                for c in runs.configs])

  def say(self, text: str) -> None:
    """A line of the whole loop's log (the first run's)."""
    self.loggers[0].log_text(text)

  def describe(self, runs: program.Runs) -> None:
    """The log's first lines: the data, devices, model (and sweep)."""
    exp = runs.exps[0]
    self.say(f"data: {exp.dataset.description}")
    self.say(f"devices: {devices.describe_devices(runs.mesh.size)}")
    self.say("model: "
             + build.describe_model(runs.template, exp.abstract_state()))
    if self.sweep:
      self.say(f"sweep: {runs.size} runs in one program, varying "
               f"{', '.join(runs.varying) or 'nothing'}; shard {runs.shard}; "
               + ("one batch stream" if runs.shared_batch
                  else "a batch stream per run"))

  def started(self, step: int | None) -> None:
    """Says from which step the runs resume (None: the start) and records
    every run's config."""
    if step is not None:
      self.say(f"resumed {len(self.configs)} runs from step {step}"
               if self.sweep else f"resumed from step {step}")
    if jax.process_index() == 0:
      # Written once the run is known to start: a command that failed at
      # start-up leaves no record that would refuse its corrected version.
      for config, workdir in zip(self.configs, self.workdirs):
        run_config.save(config, workdir)

  def check_loss(self, values: Sequence[float], where: str) -> None:
    """Stops the loop before anything of a diverged run is saved."""
    for i, value in enumerate(np.asarray(values, np.float64).reshape(-1)):
      value = float(value)
      if not (math.isfinite(value) and value <= self.max_loss):
        raise self._divergence(i, value, where)

  def _divergence(self, run: int, value: float, where: str) -> Exception:
    last = self.checkpointers[run].latest_step()
    bound = self.max_loss
    if not self.sweep:
      kept = (f"the last good checkpoint (step {last}) is kept in "
              f"{self.workdirs[run]}/checkpoints" if last is not None else
              "no checkpoint was written")
      return NonFiniteLossError(
          f"training diverged: loss {value:.4g} {where} "
          f"(config.training.max_loss={bound:g}); {kept}. Lower "
          "config.training.learning_rate or check the data")
    kept = (f"every run's last good checkpoint (step {last}) is kept"
            if last is not None else "no checkpoint was written")
    return NonFiniteLossError(
        f"run {self.names[run]} ({self.workdirs[run]}) of the sweep "
        f"diverged: loss {value:.4g} {where} (config.training.max_loss="
        f"{bound:g}); {kept}. Lower its config.training.learning_rate, or "
        "sweep the other runs without it")

  def metrics_adder(self, epoch: int) -> Callable[[int, Any], dict[str, str]]:
    """``on_metrics`` of :func:`epoch_steps`: checks every run's loss of a
    step, adds its metrics to the runs' sums (kept in ``sums``) and returns
    the progress display's postfix."""
    self.sums = [{} for _ in self.configs]

    def on_metrics(step: int, metrics: Any) -> dict[str, str]:
      per_run = {k: np.asarray(v).reshape(len(self.configs))
                 for k, v in metrics.items()}
      self.check_loss(per_run["loss"], f"at step {step} (epoch {epoch + 1})")
      for k, v in per_run.items():
        for run_sums, value in zip(self.sums, v):
          run_sums[k] = run_sums.get(k, 0.0) + float(value)
      return {k: f"{float(np.mean(v)):.3f}" for k, v in per_run.items()}
    return on_metrics

  def write_records(self, step: int, evaluated: Sequence[PyTree], *,
                    epoch: int, sums: Sequence[Mapping[str, float]],
                    steps: int, val_accuracy: Sequence[Mapping[str, float]],
                    train_seconds: float, images_per_second: float | None,
                    val_seconds: float, epoch_seconds: float
                    ) -> list[dict[str, Any]]:
    """Every run's record of the epoch (``metrics.jsonl`` and its log line),
    written before the save: a kill during the save then loses no metrics
    (a resumed run logs the epoch again; readers keep the last record)."""
    summaries = []
    for i, (config, variables) in enumerate(zip(self.configs, evaluated)):
      summary = epoch_summary(
          epoch=epoch + 1,
          learning_rate=float(self.schedules[i](step - 1)),
          train_sums=sums[i], steps=steps, val_accuracy=val_accuracy[i],
          report=sparsify.sparsity_report(variables["params"], config),
          train_seconds=train_seconds, images_per_second=images_per_second,
          val_seconds=val_seconds, epoch_seconds=epoch_seconds)
      if self.sweep:   # the sweep's throughput, shared by its runs
        summary["sweep_runs"] = len(self.configs)
        summary["sweep_images_per_second"] = (
            images_per_second * len(self.configs) if images_per_second
            else None)
      self.loggers[i].write(step, summary)
      self.loggers[i].log_text(
          (f"[{self.names[i]}] " if self.sweep else "")
          + metric_logging.format_epoch(summary) + self.synthetic)
      self.loggers[i].plot_curves_later()
      summaries.append(summary)
    return summaries

  def final_evaluations(self, runs: program.Runs,
                        summaries: Sequence[dict[str, Any]]
                        ) -> list[dict[str, Any]]:
    """Every run's test evaluation of its best checkpoint, after the last
    save."""
    self.close_checkpointers()
    results = []
    for config, workdir, exp, logger, summary in zip(
        self.configs, self.workdirs, runs.exps, self.loggers, summaries):
      result = {"validation": summary}
      if config.eval.final_attacks:
        result["test"] = eval_run.evaluate_checkpoint(
            config, workdir, exp=exp, attacks_csv=config.eval.final_attacks,
            plots=False, final=True, logger=logger)
      results.append(result)
    return results

  def close_checkpointers(self) -> None:
    """Waits for every run's last checkpoint (raising the first failed
    write, in one line), then closes the checkpointers. Twice is once."""
    checkpointers, self.checkpointers = self.checkpointers, []
    errors = []
    for checkpointer in checkpointers:
      try:
        checkpointer.close()
      except ckpt_lib.CheckpointError as e:
        errors.append(e)
    if errors:
      raise errors[0]

  def close(self) -> None:
    """:meth:`close_checkpointers`, then the logs (the curves' last
    redraw waited for)."""
    try:
      self.close_checkpointers()
    finally:
      for logger in self.loggers:
        logger.close()

  def __enter__(self) -> "Files":
    return self

  def __exit__(self, kind: Any, *_: Any) -> None:
    try:
      self.close()
    except ckpt_lib.CheckpointError as e:
      if kind is None:
        raise
      # The loop's own error is the error line; the write's is not lost.
      self.say(f"also: {e}")
