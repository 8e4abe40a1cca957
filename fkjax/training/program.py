"""The jitted pieces of a sweep: every run's step, vmapped over a run axis.

Each piece is the single run's own function (``train.make_train_step``,
``train.end_of_epoch``, ``experiment.eval_variables``, the validation
attacks), built inside ``jax.vmap`` from the run's config in which every
value that differs between the runs is a traced array. The values that all
runs share stay Python numbers, so a sweep compiles the single run's program
with a run axis added and those values turned into arguments.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fkjax.config import keys as config_keys
from fkjax.training import dispatch
from fkjax.evaluation import run as eval_run
from fkjax import evaluation
from fkjax.training import experiment as experiment_lib
from fkjax.training import parallel
from fkjax.training import train as train_lib
from fkjax.kernels import noise_jnp
from fkjax.training.sweep import spec

PyTree = Any
ConfigError = spec.ConfigError


@dataclasses.dataclass
class Sweep:
  """N runs as one program: their configs, data, model and jitted steps.

  Build with :meth:`build`. States are the single run's state dicts with a
  leading run axis on every leaf.

  Attributes:
    configs: the runs' configs (equal but for :data:`spec.SWEEPABLE_KEYS`).
    names: the runs' names, for messages.
    exps: one :class:`fkjax.training.experiment.Experiment` per run, sharing the data
      and the mesh.
    varying: the keys whose values differ between the runs.
    traced_keys: those of them that enter the program as arrays (all but
      the seeds, which make the runs' keys and batches on the host).
    values: ``{key: float32 [N]}`` for ``traced_keys``.
    shard: ``"batch"`` (the runs replicated, each batch split over the
      mesh) or ``"runs"`` (the run axis split over the mesh).
    shared_batch: whether all runs see the same batches (one data seed).
  """
  configs: list[ml_collections.ConfigDict]
  names: list[str]
  exps: list[experiment_lib.Experiment]
  varying: tuple[str, ...]
  traced_keys: tuple[str, ...]
  values: dict[str, np.ndarray]
  shard: str
  shared_batch: bool

  @classmethod
  def build(cls, configs: Sequence[ml_collections.ConfigDict],
            names: Sequence[str] | None = None, *,
            shard: str = "batch") -> "Sweep":
    """Checks the configs, loads the data once, builds every run's parts.

    Raises:
      ConfigError: configs that differ outside the sweepable keys, an
        unknown ``shard``, a run count the mesh does not divide
        (``shard="runs"``), or a multi-process JAX.
    """
    configs = list(configs)
    names = list(names) if names is not None else [
        f"run {i}" for i in range(len(configs))]
    varying = spec.check_configs(configs, names)
    if shard not in spec.SHARD_MODES:
      raise ConfigError(f"sweep shard={shard!r} is invalid: one of "
                        f"{list(spec.SHARD_MODES)}")
    if jax.process_count() > 1:
      raise ConfigError("a sweep runs in one process (its devices may be "
                        "many); train multi-host runs one at a time")
    first = experiment_lib.Experiment.build(configs[0])
    num_classes = first.dataset.num_classes
    exps = [first] + [
        dataclasses.replace(
            first, config=c,
            model=experiment_lib.create_model(c, num_classes),
            optimizer=experiment_lib.create_optimizer(c,
                                                      first.steps_per_epoch))
        for c in configs[1:]]
    if shard == "runs" and len(configs) % first.mesh.size:
      raise ConfigError(
          f"sweep shard='runs' splits the {len(configs)} runs over "
          f"{first.mesh.size} devices, which does not divide them: use a "
          "multiple of the device count, config.num_devices, or "
          "shard='batch'")
    traced = tuple(k for k in varying if k in spec.TRACED_KEYS)
    values = {k: np.asarray([float(config_keys.get(c, k)) for c in configs],
                            np.float32) for k in traced}
    shared = len({spec.effective_data_seed(c) for c in configs}) == 1
    return cls(configs, names, exps, varying, traced, values, shard, shared)

  # ---------------------------------------------------------------- basics

  @property
  def size(self) -> int:
    return len(self.configs)

  @property
  def template(self) -> ml_collections.ConfigDict:
    return self.configs[0]

  @property
  def mesh(self):
    return self.exps[0].mesh

  @property
  def steps_per_epoch(self) -> int:
    return self.exps[0].steps_per_epoch

  def run_sharding(self) -> NamedSharding:
    """Of every array with a leading run axis (states, keys, values)."""
    return NamedSharding(self.mesh, P(parallel.DATA_AXIS)
                         if self.shard == "runs" else P())

  def batch_sharding(self, per_run: bool = False) -> NamedSharding:
    """Of a batch: ``[B, ...]`` (shared) or ``[N, B, ...]`` (``per_run``)."""
    axis = parallel.DATA_AXIS
    if self.shard == "runs":
      return NamedSharding(self.mesh, P(axis) if per_run else P())
    return NamedSharding(self.mesh, P(None, axis) if per_run else P(axis))

  def place_runs(self, tree: PyTree) -> PyTree:
    return jax.device_put(tree, self.run_sharding())

  def place_batch(self, batch: Mapping[str, Any] | Sequence[Mapping[str, Any]]
                  ) -> dict[str, jax.Array]:
    """One shared batch, or one batch per run (stacked on a run axis)."""
    if isinstance(batch, Mapping):
      return jax.device_put(dict(batch), self.batch_sharding())
    stacked = {k: np.stack([b[k] for b in batch]) for k in batch[0]}
    return jax.device_put(stacked, self.batch_sharding(per_run=True))

  def place_eval_batch(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """A validation batch: split over the mesh where its size allows."""
    rows = len(batch["label"])
    if self.shard == "batch" and rows % self.mesh.size == 0:
      return jax.device_put(dict(batch), self.batch_sharding())
    return jax.device_put(dict(batch), NamedSharding(self.mesh, P()))

  def keys(self, stream: str) -> jax.Array:
    """Every run's key of ``stream`` (:func:`fkjax.training.experiment.prng_key`)."""
    return self.place_runs(jnp.stack(
        [experiment_lib.prng_key(c.seed, stream) for c in self.configs]))

  def placed_values(self) -> dict[str, jax.Array]:
    return self.place_runs({k: jnp.asarray(v) for k, v in self.values.items()})

  def stack(self, states: Sequence[PyTree]) -> PyTree:
    """Single-run states -> one state with a run axis, placed."""
    host = [jax.device_get(s) for s in states]
    return self.place_runs(jax.tree.map(lambda *xs: np.stack(xs), *host))

  @staticmethod
  def unstack(state: PyTree, size: int) -> list[PyTree]:
    """One state with a run axis -> the single-run states, on the host."""
    host = jax.device_get(state)
    return [jax.tree.map(lambda x, i=i: x[i], host) for i in range(size)]

  # ------------------------------------------------- per run, when traced

  def run_config(self, values: Mapping[str, Any]
                 ) -> ml_collections.ConfigDict:
    """The template config with ``values`` (one run's, traced) put in.

    ``model.noise_coef`` keeps the template's (non-zero) value: the model is
    built for it, and :meth:`run_model` scales its noise by the run's.
    """
    config = copy.deepcopy(self.template)
    for key, value in values.items():
      if key != "model.noise_coef":
        config_keys.set_value(config, key, value)
    return config

  def run_model(self, config: ml_collections.ConfigDict,
                values: Mapping[str, Any]):
    inject = None
    if "model.noise_coef" in values:
      # The fused CPU kernel takes its coefficient as a constant; the jnp
      # form takes the run's traced one (the same noise, to rounding).
      coef = values["model.noise_coef"]
      inject = lambda out, _, key, std_over: noise_jnp.inject_noise(
          out, coef, key, std_over)
    return experiment_lib.create_model(
        config, self.exps[0].dataset.num_classes, inject_noise=inject)

  # ------------------------------------------------------- the programs

  def initial_state(self) -> PyTree:
    """Every run's initial state: its single run's, bit for bit.

    One compiled ``model.init`` draws every run's parameters from its own
    keys (the parameters do not depend on the swept values); each run's
    optimizer state is its own optimizer's ``init``.
    """
    first = self.exps[0]
    model_init = jax.jit(functools.partial(first.model.init, train=False))
    image_shape = first.dataset.train.images.shape[1:]
    return self.stack([
        experiment_lib.init_state(
            exp.model, exp.optimizer,
            experiment_lib.prng_key(config.seed, "init_params"),
            experiment_lib.prng_key(config.seed, "init_noise"), image_shape,
            model_init=model_init)
        for exp, config in zip(self.exps, self.configs)])

  def step(self, state, batch, step, extra):
    """Every run's ``train.make_train_step`` with key ``fold_in(base_key,
    step)``, vmapped; ``extra`` is ``(base_keys, values)``. Pure."""
    base_keys, values = extra

    def one(state, batch, base_key, step, values):
      config = self.run_config(values)
      optimizer = experiment_lib.create_optimizer(config,
                                                  self.steps_per_epoch)
      step_fn = train_lib.make_train_step(self.run_model(config, values),
                                          optimizer, config)
      return step_fn(state, batch, jax.random.fold_in(base_key, step))

    axes = (0, None if self.shared_batch else 0, 0, None, 0)
    state, metrics = jax.vmap(one, in_axes=axes)(state, batch, base_keys,
                                                 step, values)
    return (jax.lax.with_sharding_constraint(state, self.run_sharding()),
            metrics)

  @functools.cached_property
  def train_step(self):
    """``train_step(state, batch, base_keys, step, values) -> (state,
    metrics)``: :meth:`step` jitted, donating the state."""
    return jax.jit(
        lambda state, batch, base_keys, step, values: self.step(
            state, batch, step, (base_keys, values)), donate_argnums=(0,))

  def program(self, train_input: dispatch.TrainInput, base_keys: jax.Array,
              values: Mapping[str, jax.Array]) -> dispatch.StepProgram:
    """:meth:`step` as a :class:`fkjax.training.dispatch.StepProgram` on
    ``train_input``'s feeds: one feed a step, or (a batch stream per run)
    the runs' feeds stacked on a leading run axis."""
    per_run = not self.shared_batch
    sharding = self.batch_sharding(per_run=per_run)

    def make_batch(data, feed):
      batch = (jax.vmap(train_input.batch, in_axes=(None, 0))(data, feed)
               if per_run else train_input.batch(data, feed))
      return jax.lax.with_sharding_constraint(batch, sharding)

    return dispatch.step_program(
        self.step, make_batch,
        data=train_input.data(NamedSharding(self.mesh, P())),
        place=lambda feed, is_stacked: dispatch.put(
            feed, dispatch.stacked(sharding) if is_stacked else sharding),
        extra=(base_keys, values))

  @functools.cached_property
  def epoch_end(self):
    """``epoch_end(state, values) -> (state, evaluated variables)``: every
    run's ``train.end_of_epoch`` and ``experiment.eval_variables``."""
    def one(state, values):
      config = self.run_config(values)
      state = train_lib.end_of_epoch(state, config)
      return state, experiment_lib.eval_variables(state, config)

    def epoch_end(state, values):
      state, evaluated = jax.vmap(one)(state, values)
      sharding = self.run_sharding()
      return (jax.lax.with_sharding_constraint(state, sharding),
              jax.lax.with_sharding_constraint(evaluated, sharding))
    return jax.jit(epoch_end, donate_argnums=(0,))

  @functools.cached_property
  def loss_check(self):
    """``loss_check(variables, images, labels, keys, values) -> [N]``:
    every run's ``train.make_loss_check``."""
    def one(variables, key, values, images, labels):
      config = self.run_config(values)
      loss = train_lib.make_loss_check(self.run_model(config, values))
      return loss(variables, images, labels, key)

    def loss_check(variables, images, labels, keys, values):
      return jax.vmap(one, in_axes=(0, 0, 0, None, None))(
          variables, keys, values, images, labels)
    return jax.jit(loss_check)

  def validation_names(self) -> list[str]:
    return list(eval_run.validation_attacks(self.template))

  @functools.cached_property
  def validation_counts(self):
    """``counts(variables, images, labels, keys, epoch, batch_index, values)
    -> int32 [N, attacks]``: every run's correct predictions on one batch
    under :func:`fkjax.evaluation.run.validation_attacks`, with the keys the
    single run's ``evaluation.Evaluator`` draws."""
    def one(variables, val_key, values, images, labels, epoch, batch_index):
      config = self.run_config(values)
      eval_apply, _ = experiment_lib.model_fns(
          self.run_model(config, values))
      suite = eval_run.validation_attacks(config)
      key = jax.random.fold_in(jax.random.fold_in(val_key, epoch),
                               batch_index)
      predict_key, *attack_keys = jax.random.split(key, len(suite) + 1)
      counts = []
      for attack, attack_key in zip(suite.values(), attack_keys):
        x_adv = attack(eval_apply, variables, images, labels, attack_key)
        probs = evaluation.predict_probs(eval_apply, variables, x_adv,
                                       predict_key)
        counts.append(jnp.sum(jnp.argmax(probs, axis=-1) == labels))
      return jnp.stack(counts)

    def counts(variables, images, labels, keys, epoch, batch_index,
               values):
      return jax.vmap(one, in_axes=(0, 0, 0, None, None, None, None))(
          variables, keys, values, images, labels, epoch, batch_index)
    return jax.jit(counts)
