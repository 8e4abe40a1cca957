"""One training step of the paper, and the end of an epoch: pure functions.

``make_train_step`` attacks the batch with PGD (``fkjax.attacks.pgd``, or
:func:`pgd_updating_batch_stats` where the attack's forward passes update
BatchNorm as PyTorch's ``train()`` mode does), takes the cross-entropy's
gradient on the adversarial images and applies the optax chain
``weight decay -> [group lasso] -> SGD (Nesterov) -> sparsifier``
(:func:`fkjax.training.build.create_optimizer`). :func:`end_of_epoch` is the
paper's per-epoch step: RVSM/RGSM replace ``w`` by its sparse projection
``u``, ADMM resets its auxiliary variables.

The loop that runs them is :mod:`fkjax.training.train`; a sweep runs them
under ``jax.vmap`` (:mod:`fkjax.training.program`), the weight gradient
outside it (:func:`over_runs`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fkjax import attacks
from fkjax.training import build
from fkjax.training import precision
from fkjax.training import sparsify

PyTree = Any


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


class StepParts(NamedTuple):
  """A training step in its three pure stages, the weight gradient between
  them (:func:`make_train_step` composes them; a sweep, :func:`over_runs`).

  Attributes:
    attack: ``(state, batch, key) -> attacked``: the images the update
      trains on and what the later stages need (a dict).
    loss: ``(params, attacked) -> (loss, (logits, batch_stats))``, whose
      gradient in ``params`` is the weight gradient.
    update: ``(state, attacked, grads, loss, logits, batch_stats) ->
      (state, metrics)``: the optax chain and the step's metrics.
  """
  attack: Callable
  loss: Callable
  update: Callable


def train_step_parts(model, optimizer: optax.GradientTransformation,
                     config: ml_collections.ConfigDict) -> StepParts:
  """The stages of ``make_train_step(model, optimizer, config)``."""
  model = precision.training_model(model, config)
  eval_apply, train_apply = build.model_fns(model)
  a = config.attack
  bn_mode = a.bn_mode
  attack_apply = eval_apply if bn_mode == "eval" else train_apply
  pgd = functools.partial(
      attacks.pgd, epsilon=a.epsilon, step_size=a.step_size,
      num_steps=a.num_steps, random_start=a.random_start, loss="ce",
      unroll=a.unroll)
  adversarial = config.training.adversarial
  track_clean = config.training.track_clean_accuracy and adversarial

  def attack(state, batch, key):
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
    return {"x_train": x_train, "images": images, "labels": labels,
            "batch_stats": batch_stats, "noise_key": noise_key,
            "clean_key": clean_key}

  def loss_fn(params, attacked):
    logits, new_vars = model.apply(
        {"params": params, "batch_stats": attacked["batch_stats"]},
        attacked["x_train"], train=True, rngs={"noise": attacked["noise_key"]},
        mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits, attacked["labels"]).mean()
    return loss, (logits, new_vars["batch_stats"])

  def update(state, attacked, grads, loss, logits, batch_stats):
    labels = attacked["labels"]
    updates, opt_state = optimizer.update(grads, state["opt_state"],
                                          state["params"])
    params = optax.apply_updates(state["params"], updates)
    percent_correct = lambda z: 100.0 * jnp.mean(jnp.argmax(z, -1) == labels)
    metrics = {"loss": loss,
               ("adv_accuracy" if adversarial else "accuracy"):
                   percent_correct(logits)}
    if track_clean:
      variables = {"params": state["params"],
                   "batch_stats": state["batch_stats"]}
      metrics["clean_accuracy"] = percent_correct(
          train_apply(variables, attacked["images"], attacked["clean_key"]))
    new_state = {"step": state["step"] + 1, "params": params,
                 "batch_stats": batch_stats, "opt_state": opt_state}
    return new_state, metrics

  return StepParts(attack, loss_fn, update)


def make_train_step(model, optimizer: optax.GradientTransformation,
                    config: ml_collections.ConfigDict) -> Callable:
  """``train_step(state, batch, key) -> (state, metrics)``, pure; in
  ``config.precision`` (:mod:`fkjax.training.precision`)."""
  return one_run(train_step_parts(model, optimizer, config))


def one_run(parts: StepParts) -> Callable:
  """``train_step(state, batch, key) -> (state, metrics)``: ``parts``
  composed, the weight gradient between them."""
  def train_step(state, batch, key):
    attacked = parts.attack(state, batch, key)
    (loss, (logits, batch_stats)), grads = jax.value_and_grad(
        parts.loss, has_aux=True)(state["params"], attacked)
    return parts.update(state, attacked, grads, loss, logits, batch_stats)

  return train_step


def over_runs(parts_of: Callable[[Any], StepParts],
              batch_axis: int | None = None) -> Callable:
  """``train_step(state, batch, keys, values) -> (state, metrics)`` of runs
  stacked on a leading axis of ``state``, ``keys`` and ``values`` (and of
  ``batch`` where ``batch_axis`` is 0): run ``i`` takes the step of
  ``parts_of(its values)`` with its key.

  The attacks and the updates are each run's under ``jax.vmap``; the weight
  gradient is taken outside it, of the sum of the runs' losses (each run's
  own gradient: the runs share nothing). So a run axis turns each forward
  convolution into one grouped by feature (a 3x3 window) and its weight
  gradient into the backward-filter form, grouped by batch, that GPUs and
  TPUs run as such; a gradient taken inside the vmap would become a
  convolution grouped by feature whose window is a whole activation.
  """
  def attack(state, batch, key, values):
    return parts_of(values).attack(state, batch, key)

  def loss(params, attacked, values):
    return parts_of(values).loss(params, attacked)

  def update(state, attacked, grads, loss, logits, batch_stats, values):
    return parts_of(values).update(state, attacked, grads, loss, logits,
                                   batch_stats)

  def total_loss(params, attacked, values):
    losses, aux = jax.vmap(loss)(params, attacked, values)
    return jnp.sum(losses), (losses, aux)

  def train_step(state, batch, keys, values):
    attacked = jax.vmap(attack, in_axes=(0, batch_axis, 0, 0))(
        state, batch, keys, values)
    (_, (losses, (logits, batch_stats))), grads = jax.value_and_grad(
        total_loss, has_aux=True)(state["params"], attacked, values)
    return jax.vmap(update)(state, attacked, grads, losses, logits,
                            batch_stats, values)

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
  params, opt_state = sparsify.sparsifier(config).end_of_epoch(
      state["params"], state["opt_state"])
  return {**state, "params": params, "opt_state": opt_state}


def make_loss_check(model) -> Callable:
  """``loss(variables, images, labels, key)``: mean clean cross-entropy in
  eval mode, to check the weights about to be saved."""
  eval_apply, _ = build.model_fns(model)

  def loss(variables, images, labels, key):
    logits = eval_apply(variables, images, key)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels).mean()
  return jax.jit(loss)
