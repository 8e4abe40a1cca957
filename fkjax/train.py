"""PGD adversarial training with RVSM / RGSM / ADMM sparsification.

``train_and_evaluate(config, workdir)`` runs the paper's protocol: each step
attacks the batch with PGD, then updates the weights through the optax chain
``weight decay -> [group lasso] -> SGD (Nesterov) -> sparsifier``. At the end
of every epoch RVSM/RGSM replace ``w`` by its sparse projection ``u`` (ADMM
resets its auxiliary variables instead), the model is validated, and a
checkpoint is written. Running the same command again resumes from the last
complete checkpoint and reaches the same parameters as an uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from fkjax import attacks
from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax import evaluate
from fkjax import kernels
from fkjax import metric_logging
from fkjax import models
from fkjax import parallel
from fkjax import sparsity

PyTree = Any


class NonFiniteLossError(FloatingPointError):
  """The training loss became NaN or infinite."""


# --------------------------------------------------------------------------
# Building blocks chosen by the config.


def enable_compilation_cache(config: ml_collections.ConfigDict) -> str | None:
  """Turns on JAX's persistent compilation cache at
  ``config.compilation_cache_dir`` (used by train.py and eval.py).

  Leaves JAX alone when the user configured a cache (the
  ``JAX_COMPILATION_CACHE_DIR`` variable or ``jax.config``) or the config
  value is empty. Returns the cache directory in use, if any.
  """
  current = jax.config.jax_compilation_cache_dir
  if current or not config.get("compilation_cache_dir"):
    return current
  path = os.path.expanduser(config.compilation_cache_dir)
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  return path


def resolve_kernels(config: ml_collections.ConfigDict
                    ) -> kernels.ModelKernels:
  """``config.kernels`` resolved for ``config.model`` (see
  :func:`fkjax.kernels.resolve`)."""
  return kernels.resolve(config.get("kernels"),
                         ensemble_size=config.model.ensemble_size,
                         noise=bool(config.model.noise_coef))


def create_model(config: ml_collections.ConfigDict, num_classes: int):
  m = config.model
  return models.create_model(
      depth=m.depth, num_classes=num_classes, ensemble_size=m.ensemble_size,
      width=m.width, skip=m.skip, noise_coef=m.noise_coef,
      noise_std_over=m.noise_std_over, normalize=m.normalize,
      **resolve_kernels(config).model_kwargs)


def describe_model(config: ml_collections.ConfigDict,
                   state: dict[str, PyTree]) -> str:
  """E.g. ``En2ResNet20 (noise 0.1, skip), 544,564 parameters; ...``."""
  m = config.model
  name = (f"En{m.ensemble_size}" if m.ensemble_size > 1 else "") + \
      f"ResNet{m.depth}" + (f"x{m.width}" if m.width != 1 else "")
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state["params"]))
  return (f"{name} (noise {m.noise_coef}, {'skip' if m.skip else 'no skip'}),"
          f" {count:,} parameters; sparsifier {config.sparsity.method}; "
          f"{resolve_kernels(config).description}")


def sparsity_hparams(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The hyperparameters of ``config.sparsity.method``, by name."""
  s = config.sparsity
  names = {"none": (), "rvsm": ("beta", "lamb"),
           "rgsm": ("beta", "lamb1", "lamb2", "group"),
           "admm": ("rho", "percent", "structure", "group")}
  if s.method not in names:
    raise ValueError(f"config.sparsity.method must be one of {sorted(names)}, "
                     f"got {s.method!r}")
  return {name: s[name] for name in names[s.method]}


def learning_rate_schedule(config: ml_collections.ConfigDict,
                           steps_per_epoch: int) -> optax.Schedule:
  """Step decay: ``lr * decay^k`` after the k-th boundary epoch."""
  t = config.training
  return optax.piecewise_constant_schedule(
      t.learning_rate,
      {int(epoch) * steps_per_epoch: t.lr_decay for epoch in t.lr_boundaries})


def create_optimizer(config: ml_collections.ConfigDict,
                     steps_per_epoch: int) -> optax.GradientTransformation:
  t = config.training
  return sparsity.sparse_sgd(
      config.sparsity.method, learning_rate_schedule(config, steps_per_epoch),
      momentum=t.momentum, nesterov=t.nesterov, weight_decay=t.weight_decay,
      **sparsity_hparams(config))


def init_state(model, optimizer: optax.GradientTransformation,
               key: jax.Array, image_shape=(32, 32, 3)) -> dict[str, PyTree]:
  """The training state: a plain dict, which orbax saves as is."""
  variables = jax.jit(functools.partial(model.init, train=False))(
      {"params": key, "noise": key}, jnp.zeros((1, *image_shape), jnp.float32))
  params = variables["params"]
  return {"step": jnp.zeros((), jnp.int32), "params": params,
          "batch_stats": variables.get("batch_stats", {}),
          "opt_state": optimizer.init(params)}


def model_fns(model) -> tuple[Callable, Callable]:
  """``(eval_apply, train_apply)`` in the ``apply_fn(variables, x, key)`` form.

  ``train_apply`` uses batch statistics and discards their update (used by
  the attack when ``config.attack.bn_mode == "train"``).
  """
  def eval_apply(variables, images, key):
    return model.apply(variables, images, train=False, rngs={"noise": key})

  def train_apply(variables, images, key):
    logits, _ = model.apply(variables, images, train=True,
                            rngs={"noise": key}, mutable=["batch_stats"])
    return logits
  return eval_apply, train_apply


# --------------------------------------------------------------------------
# The jitted step.


def make_train_step(model, optimizer: optax.GradientTransformation,
                    config: ml_collections.ConfigDict) -> Callable:
  """``train_step(state, batch, key) -> (state, metrics)``, pure."""
  eval_apply, train_apply = model_fns(model)
  attack_apply = {"train": train_apply, "eval": eval_apply}[
      config.attack.bn_mode]
  a = config.attack
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
    if adversarial:
      x_train = pgd(attack_apply, variables, images, labels, attack_key)
    else:
      x_train = images

    def loss_fn(params):
      logits, new_vars = model.apply(
          {"params": params, "batch_stats": state["batch_stats"]}, x_train,
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


def end_of_epoch(state: dict[str, PyTree], config: ml_collections.ConfigDict
                 ) -> dict[str, PyTree]:
  """The paper's per-epoch step: ``w <- u`` (RVSM/RGSM), ADMM reset."""
  method = config.sparsity.method
  if method == "none":
    return state
  params = state["params"]
  if method in ("rvsm", "rgsm"):
    params = sparsity.project(params, method, **sparsity_hparams(config))
    return {**state, "params": params}
  # ADMM: w stays dense during training; z, u restart from Proj(w), 0.
  return {**state, "opt_state": sparsity.admm_reset(state["opt_state"],
                                                     params)}


def eval_variables(state: dict[str, PyTree], config: ml_collections.ConfigDict
                   ) -> dict[str, PyTree]:
  """The variables evaluated: the sparse ``u`` for every method."""
  params = state["params"]
  if config.sparsity.method != "none":
    params = sparsity.project(params, config.sparsity.method,
                              **sparsity_hparams(config))
  return {"params": params, "batch_stats": state["batch_stats"]}


# --------------------------------------------------------------------------
# The loop.


def load_dataset(config: ml_collections.ConfigDict) -> data_lib.Dataset:
  d = config.dataset
  return data_lib.load_dataset(
      d.name, d.source, d.data_dir, val_size=d.val_size,
      split_seed=d.split_seed, subset_per_class=d.subset_per_class,
      test_subset_per_class=d.test_subset_per_class,
      synthetic_sizes=tuple(d.synthetic_sizes),
      tfds_data_dir=d.tfds_data_dir)


def _limit(split: data_lib.Split, num_examples: int) -> data_lib.Split:
  if num_examples and num_examples < len(split.labels):
    return data_lib.Split(split.images[:num_examples],
                          split.labels[:num_examples])
  return split


def sharded_eval_batches(split: data_lib.Split, batch_size: int,
                         mesh) -> Iterator[dict[str, jax.Array]]:
  """Padded, masked evaluation batches placed on the mesh."""
  parallel.check_batch_size(batch_size, mesh)
  for batch in data_lib.eval_batches(
      split, batch_size, process_index=jax.process_index(),
      process_count=jax.process_count()):
    yield parallel.shard_batch(batch, mesh)


def attack_suite(names: str, config: ml_collections.ConfigDict
                 ) -> dict[str, evaluate.Attack]:
  """The attacks named in a comma-separated string, from the eval config."""
  e = config.eval
  every = evaluate.default_attacks(
      eot_samples=e.eot_samples, nattack_iters=e.nattack_iters,
      epsilon=config.attack.epsilon, step_size=config.attack.step_size,
      nattack_population=e.nattack_population, nattack_chunk=e.nattack_chunk,
      nattack_image_chunk=e.nattack_image_chunk,
      unroll=config.attack.unroll)
  wanted = [n.strip() for n in names.split(",") if n.strip()]
  unknown = sorted(set(wanted) - set(every))
  if unknown:
    raise ValueError(f"unknown attacks {unknown}; choose from {list(every)}")
  return {name: every[name] for name in wanted}


def validation_attacks(config: ml_collections.ConfigDict
                       ) -> dict[str, evaluate.Attack]:
  suite = {"natural": evaluate.natural}
  steps = config.validation.attack_steps
  if steps:
    suite[f"pgd{steps}"] = functools.partial(
        attacks.pgd, epsilon=config.attack.epsilon,
        step_size=config.attack.step_size, num_steps=steps,
        random_start=False, unroll=config.attack.unroll)
  return suite


def _check_config(config: ml_collections.ConfigDict) -> None:
  if config.validation.select_by not in ("natural", "pgd"):
    raise ValueError("config.validation.select_by must be 'natural' or 'pgd'")
  if config.validation.select_by == "pgd" and not config.validation.attack_steps:
    raise ValueError("select_by='pgd' needs config.validation.attack_steps > 0")
  if config.attack.bn_mode not in ("train", "eval"):
    raise ValueError("config.attack.bn_mode must be 'train' or 'eval'")
  sparsity_hparams(config)


def _save_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes ``config.json``; refuses a workdir trained with another model."""
  path = os.path.join(workdir, "config.json")
  new = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    for section in ("model", "sparsity", "dataset"):
      if old.get(section) != new.get(section):
        raise ValueError(
            f"{workdir!r} holds a run with a different config.{section} "
            f"({old.get(section)} vs {new.get(section)}); use a new workdir")
  with open(path, "w") as f:
    json.dump(new, f, indent=2, sort_keys=True)


@dataclasses.dataclass
class Experiment:
  """Everything built from a config: data, model, optimizer, mesh."""
  config: ml_collections.ConfigDict
  dataset: data_lib.Dataset
  model: Any
  optimizer: optax.GradientTransformation
  steps_per_epoch: int
  mesh: Any

  @classmethod
  def build(cls, config: ml_collections.ConfigDict) -> "Experiment":
    _check_config(config)
    dataset = load_dataset(config)
    mesh = parallel.make_mesh(config.num_devices or None)
    parallel.check_batch_size(config.training.batch_size, mesh)
    steps = data_lib.steps_per_epoch(len(dataset.train.labels),
                                     config.training.batch_size)
    model = create_model(config, dataset.num_classes)
    return cls(config, dataset, model, create_optimizer(config, steps),
               steps, mesh)

  def _init(self) -> dict[str, PyTree]:
    key = jax.random.key(self.config.seed)
    return init_state(self.model, self.optimizer, key,
                      self.dataset.train.images.shape[1:])

  def initial_state(self) -> dict[str, PyTree]:
    return parallel.replicate(self._init(), self.mesh)

  def abstract_state(self) -> dict[str, PyTree]:
    """Shapes, dtypes and shardings of the state, computed without running."""
    sharding = parallel.replicated(self.mesh)
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        jax.eval_shape(self._init))

  def restore(self, checkpointer: ckpt_lib.Checkpointer, which: str
              ) -> tuple[int, dict[str, PyTree]]:
    return checkpointer.restore(self.abstract_state(), which)


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, Any]:
  """Trains (or resumes) in ``workdir`` and evaluates the best checkpoint.

  Returns:
    A summary: the last validation metrics and the test evaluation.
  """
  os.makedirs(workdir, exist_ok=True)
  exp = Experiment.build(config)
  _save_config(config, workdir)
  logger = metric_logging.MetricLogger(workdir,
                                       enabled=jax.process_index() == 0)
  logger.log_text(f"data: {exp.dataset.description}")
  logger.log_text(f"devices: {exp.mesh.size} x {jax.devices()[0].platform}")
  logger.log_text(f"model: {describe_model(config, exp.abstract_state())}")
  checkpointer = ckpt_lib.Checkpointer(workdir)
  if checkpointer.latest_step() is None:
    state = exp.initial_state()
  else:
    _, state = exp.restore(checkpointer, "latest")
    logger.log_text(f"resumed from step {int(state['step'])}")
  start_step = int(state["step"])

  train_step = jax.jit(make_train_step(exp.model, exp.optimizer, config),
                       donate_argnums=(0,))
  eval_apply, _ = model_fns(exp.model)
  val_split = _limit(exp.dataset.val, config.validation.num_examples)
  val_attacks = validation_attacks(config)
  validator = evaluate.Evaluator(eval_apply, val_attacks)
  base_key = jax.random.key(config.seed + 1)
  val_key = jax.random.key(config.seed + 3)
  t = config.training
  total_steps = t.num_epochs * exp.steps_per_epoch
  val_summary: dict[str, Any] = {}
  synthetic = " [SYNTHETIC DATA]" if exp.dataset.is_synthetic else ""

  first_epoch = start_step // exp.steps_per_epoch
  for epoch in range(first_epoch, t.num_epochs):
    epoch_start = time.perf_counter()
    batches = data_lib.train_batches(
        exp.dataset.train, t.batch_size, seed=config.seed, epoch=epoch,
        augment=t.augment, process_index=jax.process_index(),
        process_count=jax.process_count())
    # steps of this epoch already done (resuming from a mid-epoch checkpoint)
    skip = int(state["step"]) - epoch * exp.steps_per_epoch
    state_step = skip
    batches = itertools.islice(batches, skip, None)
    sums: dict[str, float] = {}
    bar = tqdm.tqdm(batches, total=exp.steps_per_epoch, initial=skip,
                    desc=f"epoch {epoch + 1}/{t.num_epochs}{synthetic}",
                    unit="step", disable=not config.progress, leave=False)
    # Metrics are read one step late, so that the host prepares the next
    # batch while the device still runs this step (reading them at once
    # would wait for the device every step).
    pending = None
    # Throughput after the epoch's first step, which includes compilation.
    seen = {"steps": 0, "first_done": None}

    def consume(step_and_metrics):
      step, metrics = step_and_metrics
      metrics = jax.device_get(metrics)
      seen["steps"] += 1
      if seen["steps"] == 1:
        seen["first_done"] = time.perf_counter()
      if not math.isfinite(float(metrics["loss"])):
        checkpointer.close()
        raise NonFiniteLossError(
            f"non-finite training loss {metrics['loss']} at step {step} "
            f"(epoch {epoch + 1}); the last good checkpoint is kept in "
            f"{workdir}/checkpoints (step {checkpointer.latest_step()}). "
            "Lower the learning rate or check the data.")
      for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v)
      bar.set_postfix({k: f"{v:.3f}" for k, v in metrics.items()})

    for batch in bar:
      step = epoch * exp.steps_per_epoch + state_step
      key = jax.random.fold_in(base_key, step)
      state, metrics = train_step(state, parallel.shard_batch(batch, exp.mesh),
                                  key)
      if pending is not None:
        consume(pending)
      pending = (step, metrics)
      state_step += 1
      every = t.checkpoint_every_steps
      if every and (step + 1) % every == 0 and state_step < exp.steps_per_epoch:
        consume(pending)  # never checkpoint a state with a non-finite loss
        pending = None
        checkpointer.save(step + 1, state)
    if pending is not None:
      consume(pending)
    bar.close()
    steady = (time.perf_counter() - seen["first_done"]
              if seen["steps"] > 1 else None)
    state = end_of_epoch(state, config)
    train_seconds = time.perf_counter() - epoch_start

    evaluated = eval_variables(state, config)
    val = validator(evaluated,
                    sharded_eval_batches(val_split,
                                         config.validation.batch_size,
                                         exp.mesh),
                    jax.random.fold_in(val_key, epoch))
    report = sparsity.sparsity_report(evaluated["params"],
                                      group=config.sparsity.group)
    n_steps = max(1, state_step - skip)
    val_summary = {
        "epoch": epoch + 1,
        "learning_rate": float(learning_rate_schedule(
            config, exp.steps_per_epoch)(int(state["step"]) - 1)),
        **{f"train_{k}": v / n_steps for k, v in sums.items()},
        **{f"val_{name}_accuracy": r["accuracy"]
           for name, r in val["attacks"].items()},
        "weight_sparsity": report.weight_sparsity,
        "channel_sparsity": report.channel_sparsity,
        "train_seconds": train_seconds,
        # global batch: every process's images, after the first step
        "train_images_per_second": (
            (seen["steps"] - 1) * t.batch_size / steady if steady else None),
        "val_seconds": sum(r["seconds"] for r in val["attacks"].values()),
    }
    select = ("natural" if config.validation.select_by == "natural"
              else f"pgd{config.validation.attack_steps}")
    checkpointer.save(int(state["step"]), state,
                      val_accuracy=val["attacks"][select]["accuracy"])
    logger.write(int(state["step"]), val_summary)
    logger.log_text(metric_logging.format_epoch(val_summary) + synthetic)
    if int(state["step"]) >= total_steps:
      break

  checkpointer.close()
  summary = {"validation": val_summary}
  if config.eval.final_attacks:
    summary["test"] = evaluate_checkpoint(config, workdir, exp=exp,
                                          attacks_csv=config.eval.final_attacks,
                                          plots=False, logger=logger)
  logger.close()
  return summary


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str, *,
                        exp: Experiment | None = None,
                        attacks_csv: str | None = None,
                        plots: bool | None = None,
                        logger: metric_logging.MetricLogger | None = None
                        ) -> dict[str, Any]:
  """Restores a checkpoint and measures A1..A5 and sparsity on the test set.

  Writes ``<workdir>/eval.json`` (and PNG plots if asked).
  """
  from fkjax import plots as plots_lib  # matplotlib only when needed

  exp = exp or Experiment.build(config)
  checkpointer = ckpt_lib.Checkpointer(workdir, must_exist=True)
  step, state = exp.restore(checkpointer, config.eval.checkpoint)
  checkpointer.close()
  variables = eval_variables(state, config)
  eval_apply, _ = model_fns(exp.model)
  suite = attack_suite(attacks_csv or config.eval.attacks, config)
  test = _limit(exp.dataset.test, config.eval.num_examples)
  results = evaluate.robust_accuracy(
      eval_apply, variables,
      sharded_eval_batches(test, config.eval.batch_size, exp.mesh), suite,
      jax.random.key(config.seed + 2),
      num_noise_draws=config.eval.num_noise_draws, progress=config.progress)
  report = sparsity.sparsity_report(variables["params"],
                                    group=config.sparsity.group)
  results.update(
      checkpoint=config.eval.checkpoint, step=step,
      data=exp.dataset.description, eot_samples=config.eval.eot_samples,
      weight_sparsity=report.weight_sparsity,
      total_weight_sparsity=report.total_weight_sparsity,
      channel_sparsity=report.channel_sparsity)
  table = evaluate.format_table(results, sparsity=report.weight_sparsity,
                                channel_sparsity=report.channel_sparsity)
  eot = config.eval.eot_samples
  evaluate.save_json(results, os.path.join(
      workdir, "eval.json" if eot == 1 else f"eval_eot{eot}.json"))
  if plots if plots is not None else config.eval.plots:
    results["plots"] = plots_lib.save_all(variables["params"], report,
                                          os.path.join(workdir, "plots"))
  text = (f"test evaluation of the {config.eval.checkpoint} checkpoint "
          f"(step {step}, {results['num_examples']} images, "
          f"{exp.dataset.description}):\n{table}\n{report.format_table()}")
  if logger is not None:
    logger.log_text(text)
  else:
    print(text)
  return results
