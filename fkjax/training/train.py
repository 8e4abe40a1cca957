"""PGD adversarial training with RVSM / RGSM / ADMM sparsification.

``train_and_evaluate(config, workdir)`` runs the paper's protocol: each step
attacks the batch with PGD, then updates the weights through the optax chain
``weight decay -> [group lasso] -> SGD (Nesterov) -> sparsifier``. At the end
of every epoch RVSM/RGSM replace ``w`` by its sparse projection ``u`` (ADMM
resets its auxiliary variables instead), the model is validated, and a
checkpoint is written. Running the same command again resumes from the last
complete checkpoint and reaches the same parameters as an uninterrupted run.

What is built from the config lives in :mod:`fkjax.training.experiment`; the epoch
loop, which a sweep shares (:class:`SingleRun` is one run of it), in
:mod:`fkjax.training.loop`; the test evaluation of a checkpoint in
:mod:`fkjax.evaluation.run`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fkjax import attacks
from fkjax.training import dispatch
from fkjax.evaluation import run as eval_run
from fkjax import evaluation
from fkjax.training import experiment as experiment_lib
from fkjax.training import parallel
from fkjax.training import precision
from fkjax.config import record as run_config
from fkjax.training import loop as run_loop
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
  ``config.precision`` (:mod:`fkjax.training.precision`)."""
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
  run_loop.check_resumable([config], [workdir])
  exp = experiment_lib.Experiment.build(config)
  return run_loop.train(SingleRun(exp, workdir))[0]


class SingleRun(run_loop.Runs):
  """One run for :func:`fkjax.training.loop.train`: its state on the mesh,
  batches split over it, validated by :class:`fkjax.evaluation.Evaluator`."""

  def __init__(self, exp: experiment_lib.Experiment, workdir: str):
    super().__init__([exp.config], [workdir], [exp])
    self.exp, self.config, self.workdir = exp, exp.config, workdir
    self.checkpointer = self.checkpointers[0]
    self._val_key = experiment_lib.prng_key(exp.config.seed, "validation")

  def describe_devices(self) -> str:
    return experiment_lib.describe_devices(self.exp.mesh.size)

  def restore_or_init(self) -> PyTree:
    if self.checkpointer.latest_step() is None:
      return self.exp.initial_state()
    _, state = self.exp.restore(self.checkpointer, "latest")
    self.say(f"resumed from step {int(state['step'])}")
    return state

  def program(self, train_input: dispatch.TrainInput
              ) -> dispatch.StepProgram:
    return train_program(self.exp, self.config, train_input,
                         experiment_lib.prng_key(self.config.seed, "train"))

  def feeds(self, train_input: dispatch.TrainInput, epoch: int):
    return train_input.feeds(experiment_lib.data_seed(self.config), epoch)

  def epoch_end(self, state: PyTree) -> tuple[PyTree, PyTree]:
    state = end_of_epoch(state, self.config)
    return state, experiment_lib.eval_variables(state, self.config)

  def step_of(self, state: PyTree) -> int:
    return int(state["step"])

  def _val_batches(self, split):
    return eval_run.sharded_eval_batches(
        split, self.config.validation.batch_size, self.exp.mesh)

  @functools.cached_property
  def _loss_check(self) -> Callable:
    return make_loss_check(self.exp.model)

  def weights_loss(self, evaluated: PyTree, split) -> list[float]:
    batch = next(self._val_batches(split))
    return [float(self._loss_check(evaluated, batch["image"], batch["label"],
                                   self._val_key))]

  @functools.cached_property
  def _validator(self) -> evaluation.Evaluator:
    eval_apply, _ = experiment_lib.model_fns(self.exp.model)
    return evaluation.Evaluator(eval_apply,
                              eval_run.validation_attacks(self.config),
                              batch_key="config.validation.batch_size")

  def validate(self, evaluated: PyTree, split, epoch: int
               ) -> list[dict[str, float]]:
    val = self._validator(evaluated, self._val_batches(split),
                          jax.random.fold_in(self._val_key, epoch))
    return [val.accuracies()]

  def per_run(self, evaluated: PyTree) -> list[PyTree]:
    return [evaluated]

  def save(self, step: int, state: PyTree,
           val_accuracy: Sequence[float] | None = None) -> None:
    self.checkpointer.save(step, state, val_accuracy=(
        None if val_accuracy is None else val_accuracy[0]))

  def divergence(self, run: int, value: float, bound: float,
                 where: str) -> Exception:
    del run
    last = self.checkpointer.latest_step()
    kept = (f"the last good checkpoint (step {last}) is kept in "
            f"{self.workdir}/checkpoints" if last is not None else
            "no checkpoint was written")
    return NonFiniteLossError(
        f"training diverged: loss {value:.4g} {where} "
        f"(config.training.max_loss={bound:g}); {kept}. Lower "
        "config.training.learning_rate or check the data")
