"""PGD adversarial training with RVSM / RGSM / ADMM sparsification.

``train_and_evaluate(config, workdir)`` runs the paper's protocol: each step
attacks the batch with PGD, then updates the weights through the optax chain
``weight decay -> [group lasso] -> SGD (Nesterov) -> sparsifier``. At the end
of every epoch RVSM/RGSM replace ``w`` by its sparse projection ``u`` (ADMM
resets its auxiliary variables instead), the model is validated, and a
checkpoint is written. Running the same command again resumes from the last
complete checkpoint and reaches the same parameters as an uninterrupted run.

What is built from the config lives in :mod:`fkjax.experiment`; the test
evaluation of a checkpoint in :mod:`fkjax.eval_run`.
"""
from __future__ import annotations

import functools
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fkjax import attacks
from fkjax import checkpoint as ckpt_lib
from fkjax import dispatch
from fkjax import epoch_steps
from fkjax import eval_run
from fkjax import evaluate
from fkjax import experiment as experiment_lib
from fkjax import metric_logging
from fkjax import parallel
from fkjax import precision
from fkjax import run_config
from fkjax import workdir as workdir_lib
from fkjax.errors import NonFiniteLossError

PyTree = Any

# --------------------------------------------------------------------------
# The jitted step.


def pgd_updating_batch_stats(model, variables, images, labels, key, *,
                             epsilon: float, step_size: float,
                             num_steps: int, random_start: bool = True
                             ) -> tuple[jax.Array, PyTree]:
  """PGD on the cross-entropy whose forward passes update BatchNorm's
  running averages, as a PyTorch model in ``train()`` mode does.

  The same iterates as ``attacks.pgd(train_apply, ...)`` with the same key;
  returns them with the ``batch_stats`` after ``num_steps`` updates.
  """
  start_key, steps_key = jax.random.split(key)
  x = images
  if random_start:
    noise = attacks.common.uniform(start_key, images.shape, -epsilon, epsilon)
    x = attacks.project(images + noise, images, epsilon)
  params = variables["params"]

  def step(carry, step_key):
    x, stats = carry

    def loss(x):
      logits, new = model.apply({"params": params, "batch_stats": stats}, x,
                                train=True, rngs={"noise": step_key},
                                mutable=["batch_stats"])
      return jnp.sum(attacks.cross_entropy(logits, labels)), new[
          "batch_stats"]

    grad, stats = jax.grad(loss, has_aux=True)(x)
    x = attacks.project(x + step_size * jnp.sign(grad), images, epsilon)
    return (x, stats), None

  if num_steps <= 0:
    return x, variables["batch_stats"]
  (x, stats), _ = jax.lax.scan(step, (x, variables["batch_stats"]),
                               jax.random.split(steps_key, num_steps))
  return x, stats


def make_train_step(model, optimizer: optax.GradientTransformation,
                    config: ml_collections.ConfigDict) -> Callable:
  """``train_step(state, batch, key) -> (state, metrics)``, pure; in
  ``config.precision`` (:mod:`fkjax.precision`)."""
  model = precision.training_model(model, config)
  eval_apply, train_apply = experiment_lib.model_fns(model)
  a = config.attack
  bn_mode = a.bn_mode
  attack_apply = eval_apply if bn_mode == "eval" else train_apply
  pgd = functools.partial(
      attacks.pgd, epsilon=a.epsilon, step_size=a.step_size,
      num_steps=a.num_steps, random_start=a.random_start, loss="ce",
      unroll=a.unroll)
  adversarial = config.training.adversarial
  track_clean = config.training.track_clean_accuracy and adversarial

  def train_step(state, batch, key):
    images, labels = batch["image"], batch["label"]
    attack_key, noise_key, clean_key = jax.random.split(key, 3)
    variables = {"params": state["params"],
                 "batch_stats": state["batch_stats"]}
    batch_stats = state["batch_stats"]
    if adversarial and bn_mode == "update":
      x_train, batch_stats = pgd_updating_batch_stats(
          model, variables, images, labels, attack_key, epsilon=a.epsilon,
          step_size=a.step_size, num_steps=a.num_steps,
          random_start=a.random_start)
    elif adversarial:
      x_train = pgd(attack_apply, variables, images, labels, attack_key)
    else:
      x_train = images

    def loss_fn(params):
      logits, new_vars = model.apply(
          {"params": params, "batch_stats": batch_stats}, x_train,
          train=True, rngs={"noise": noise_key}, mutable=["batch_stats"])
      loss = optax.softmax_cross_entropy_with_integer_labels(
          logits, labels).mean()
      return loss, (logits, new_vars["batch_stats"])

    (loss, (logits, batch_stats)), grads = jax.value_and_grad(
        loss_fn, has_aux=True)(state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"],
                                          state["params"])
    params = optax.apply_updates(state["params"], updates)
    percent_correct = lambda z: 100.0 * jnp.mean(jnp.argmax(z, -1) == labels)
    metrics = {"loss": loss,
               ("adv_accuracy" if adversarial else "accuracy"):
                   percent_correct(logits)}
    if track_clean:
      metrics["clean_accuracy"] = percent_correct(
          train_apply(variables, images, clean_key))
    new_state = {"step": state["step"] + 1, "params": params,
                 "batch_stats": batch_stats, "opt_state": opt_state}
    return new_state, metrics

  return train_step


def reset_momentum(opt_state: PyTree) -> PyTree:
  """``opt_state`` with every momentum buffer (``optax.TraceState``) zeroed:
  what re-creating a PyTorch SGD optimizer does, step counts kept."""
  is_trace = lambda node: isinstance(node, optax.TraceState)
  return jax.tree.map(
      lambda node: node._replace(trace=jax.tree.map(jnp.zeros_like,
                                                     node.trace))
      if is_trace(node) else node, opt_state, is_leaf=is_trace)


def end_of_epoch(state: dict[str, PyTree], config: ml_collections.ConfigDict
                 ) -> dict[str, PyTree]:
  """The paper's per-epoch step: ``w <- u`` (RVSM/RGSM), ADMM reset; and
  the momentum reset of ``config.training.reset_momentum``."""
  if config.training.reset_momentum:
    state = {**state, "opt_state": reset_momentum(state["opt_state"])}
  params, opt_state = experiment_lib.sparsifier(config).end_of_epoch(
      state["params"], state["opt_state"])
  return {**state, "params": params, "opt_state": opt_state}


def _check_loss(value: float, bound: float, where: str, checkpointer,
                workdir: str) -> None:
  """Stops a diverged run before anything of it is saved."""
  if math.isfinite(value) and value <= bound:
    return
  last = checkpointer.latest_step()
  kept = (f"the last good checkpoint (step {last}) is kept in "
          f"{workdir}/checkpoints" if last is not None else
          "no checkpoint was written")
  raise NonFiniteLossError(
      f"training diverged: loss {value:.4g} {where} "
      f"(config.training.max_loss={bound:g}); {kept}. Lower "
      "config.training.learning_rate or check the data")


def make_loss_check(model) -> Callable:
  """``loss(variables, images, labels, key)``: mean clean cross-entropy in
  eval mode, to check the weights about to be saved."""
  eval_apply, _ = experiment_lib.model_fns(model)

  def loss(variables, images, labels, key):
    logits = eval_apply(variables, images, key)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels).mean()
  return jax.jit(loss)


def train_program(exp: experiment_lib.Experiment,
                  config: ml_collections.ConfigDict,
                  train_input: dispatch.TrainInput, base_key: jax.Array
                  ) -> dispatch.StepProgram:
  """A single run's step program: ``make_train_step`` with the key
  ``fold_in(base_key, step)``, its batches split over the mesh."""
  train_step = make_train_step(exp.model, exp.optimizer, config)
  sharding = parallel.batch_sharding(exp.mesh)

  def make_batch(data, feed):
    return jax.lax.with_sharding_constraint(train_input.batch(data, feed),
                                            sharding)
  return dispatch.step_program(
      lambda state, batch, step, key: train_step(
          state, batch, jax.random.fold_in(key, step)),
      make_batch, data=train_input.data(parallel.replicated(exp.mesh)),
      place=lambda feed, is_stacked: dispatch.put(
          feed, dispatch.stacked(sharding) if is_stacked else sharding),
      extra=base_key)


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
    return _train_and_evaluate(config, workdir)
  finally:
    if lock is not None:
      lock.release()


def _train_and_evaluate(config: ml_collections.ConfigDict,
                        workdir: str) -> dict[str, Any]:
  if ckpt_lib.has_checkpoints(workdir):
    run_config.check_same_run(config, workdir)
  exp = experiment_lib.Experiment.build(config)
  os.makedirs(workdir, exist_ok=True)
  logger = metric_logging.MetricLogger(workdir,
                                       enabled=jax.process_index() == 0)
  logger.log_text(f"data: {exp.dataset.description}")
  logger.log_text(
      f"devices: {experiment_lib.describe_devices(exp.mesh.size)}")
  logger.log_text(
      f"model: {experiment_lib.describe_model(config, exp.abstract_state())}")
  checkpointer = ckpt_lib.Checkpointer(workdir)
  if checkpointer.latest_step() is None:
    state = exp.initial_state()
  else:
    _, state = exp.restore(checkpointer, "latest")
    logger.log_text(f"resumed from step {int(state['step'])}")
  if jax.process_index() == 0:
    # Written once the run is known to start: a command that failed at
    # start-up leaves no record that would refuse its corrected version.
    run_config.save(config, workdir)

  train_input = dispatch.TrainInput.build(config, exp.dataset.train)
  steps_per_dispatch = dispatch.resolve_steps_per_dispatch(config)
  logger.log_text("training: " + dispatch.describe(
      train_input.pipeline, steps_per_dispatch, config))
  base_key = experiment_lib.prng_key(config.seed, "train")
  program = train_program(exp, config, train_input, base_key)
  loss_check = make_loss_check(exp.model)
  eval_apply, _ = experiment_lib.model_fns(exp.model)
  val_split = eval_run.limit(
      exp.dataset.test if config.validation.split == "test"
      else exp.dataset.val, config.validation.num_examples)
  validator = evaluate.Evaluator(eval_apply,
                                 eval_run.validation_attacks(config))
  val_key = experiment_lib.prng_key(config.seed, "validation")
  t = config.training
  max_loss = float(t.get("max_loss") or math.inf)
  total_steps = t.num_epochs * exp.steps_per_epoch
  val_summary: dict[str, Any] = {}
  synthetic = " [SYNTHETIC DATA]" if exp.dataset.is_synthetic else ""
  schedule = experiment_lib.learning_rate_schedule(config, exp.steps_per_epoch)

  first_epoch = int(state["step"]) // exp.steps_per_epoch
  for epoch in range(first_epoch, t.num_epochs):
    epoch_start = time.perf_counter()
    feeds = train_input.feeds(experiment_lib.data_seed(config), epoch)
    # steps of this epoch already done (resuming from a mid-epoch checkpoint)
    skip = int(state["step"]) - epoch * exp.steps_per_epoch
    sums: dict[str, float] = {}

    def on_metrics(step, metrics, epoch=epoch, sums=sums):
      _check_loss(float(metrics["loss"]), max_loss,
                  f"at step {step} (epoch {epoch + 1})", checkpointer, workdir)
      for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v)
      return {k: f"{v:.3f}" for k, v in metrics.items()}

    ran = epoch_steps.run_epoch_steps(
        state, feeds, first_step=epoch * exp.steps_per_epoch, skip=skip,
        steps_per_epoch=exp.steps_per_epoch, step_fn=program,
        on_metrics=on_metrics, save=checkpointer.save,
        checkpoint_every=t.checkpoint_every_steps,
        desc=f"epoch {epoch + 1}/{t.num_epochs}{synthetic}",
        progress=config.progress, steps_per_dispatch=steps_per_dispatch,
        scan_limit=train_input.scan_limit)
    state = end_of_epoch(ran.state, config)
    train_seconds = time.perf_counter() - epoch_start

    evaluated = experiment_lib.eval_variables(state, config)
    check_batch = next(eval_run.sharded_eval_batches(
        val_split, config.validation.batch_size, exp.mesh))
    # The loss of a step is taken before its update: a step that blows the
    # weights up shows only in the next one. Check the weights about to be
    # saved, so that a checkpoint is never a diverged model.
    _check_loss(float(loss_check(evaluated, check_batch["image"],
                                 check_batch["label"], val_key)),
                max_loss, f"of the weights after epoch {epoch + 1}",
                checkpointer, workdir)
    val = validator(evaluated,
                    eval_run.sharded_eval_batches(
                        val_split, config.validation.batch_size, exp.mesh),
                    jax.random.fold_in(val_key, epoch))
    report = experiment_lib.sparsity_report(evaluated["params"], config)
    n_steps = max(1, ran.steps)
    val_summary = {
        "epoch": epoch + 1,
        "learning_rate": float(schedule(int(state["step"]) - 1)),
        **{f"train_{k}": v / n_steps for k, v in sums.items()},
        **{f"val_{name}_accuracy": accuracy
           for name, accuracy in val.accuracies().items()},
        "weight_sparsity": report.weight_sparsity,
        "channel_sparsity": report.channel_sparsity,
        "train_seconds": train_seconds,
        # global batch: every process's images, after the first step
        "train_images_per_second": ran.images_per_second(t.batch_size),
        "val_seconds": sum(r.seconds for r in val.attacks.values()),
    }
    select = ("natural" if config.validation.select_by == "natural"
              else f"pgd{config.validation.attack_steps}")
    # The epoch's line first: a kill during the save then loses no metrics
    # (a resumed run logs the epoch again; readers keep the last record).
    logger.write(int(state["step"]), val_summary)
    logger.log_text(metric_logging.format_epoch(val_summary) + synthetic)
    checkpointer.save(int(state["step"]), state,
                      val_accuracy=val.accuracy(select))
    if int(state["step"]) >= total_steps:
      break

  checkpointer.close()
  summary = {"validation": val_summary}
  if config.eval.final_attacks:
    summary["test"] = eval_run.evaluate_checkpoint(
        config, workdir, exp=exp, attacks_csv=config.eval.final_attacks,
        plots=False, final=True, logger=logger)
  logger.close()
  return summary
