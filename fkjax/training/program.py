"""The jitted programs of N runs stepped together on a run axis; a single
run is N = 1.

Each program is the single run's own function (``step.make_train_step``,
``step.end_of_epoch``, ``sparsify.eval_variables``, the validation attacks)
built from the run's config. For N > 1 (a sweep) it runs inside ``jax.vmap``
with every value that differs between the runs a traced array; the values
that all runs share stay Python numbers, so a sweep compiles the single
run's program with a run axis added and those values turned into
arguments; the training step's weight gradient alone is taken outside
the vmap (``step.over_runs``: the backward-filter form of a run axis, as of
an ensemble's members). For N = 1 there is no run axis: a single run's state, keys and
programs are the single run's own, not a vmap of them (vmapped convolutions
compile slower and round differently), and every method below takes and
returns them as they are.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax.config import keys as config_keys
from fkjax.config import record as run_config
from fkjax.evaluation import loop as eval_loop
from fkjax.evaluation import memory as eval_memory
from fkjax.training import build
from fkjax.training import input_pipeline
from fkjax.training import parallel
from fkjax.training import sparsify
from fkjax.training import step as step_lib
from fkjax.training import validation
from fkjax.training.sweep import spec

PyTree = Any
ConfigError = run_config.ConfigError


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


@dataclasses.dataclass
class Runs:
  """N runs as one program: their configs, data, model and jitted steps.

  Build with :meth:`build`. States are the single run's state dicts with a
  leading run axis on every leaf (N > 1), or the single run's own (N = 1).

  Attributes:
    configs: the runs' configs (equal but for :data:`spec.SWEEPABLE_KEYS`).
    names: the runs' names, for messages.
    exps: one :class:`fkjax.training.build.Experiment` per run, sharing the
      data and the mesh.
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
  exps: list[build.Experiment]
  varying: tuple[str, ...]
  traced_keys: tuple[str, ...]
  values: dict[str, np.ndarray]
  shard: str
  shared_batch: bool

  @classmethod
  def build(cls, configs: Sequence[ml_collections.ConfigDict],
            names: Sequence[str] | None = None, *,
            shard: str = "batch") -> "Runs":
    """Checks the configs, loads the data once, builds every run's parts.

    Raises:
      ConfigError: configs that differ outside the sweepable keys, an
        unknown ``shard``, a run count the mesh does not divide
        (``shard="runs"``), or several runs in a multi-process JAX.
    """
    configs = list(configs)
    names = list(names) if names is not None else [
        f"run {i}" for i in range(len(configs))]
    varying = spec.check_configs(configs, names)
    if shard not in spec.SHARD_MODES:
      raise ConfigError(f"sweep shard={shard!r} is invalid: one of "
                        f"{list(spec.SHARD_MODES)}")
    if jax.process_count() > 1 and len(configs) > 1:
      raise ConfigError("a sweep runs in one process (its devices may be "
                        "many); train multi-host runs one at a time")
    first = build.Experiment.build(configs[0])
    # Before the first epoch, not at its end: a validation or final
    # evaluation batch the host cannot hold would lose it.
    for c in configs:
      eval_memory.check_host_batches(c, first.dataset)
    num_classes = first.dataset.num_classes
    exps = [first] + [
        dataclasses.replace(
            first, config=c, model=build.create_model(c, num_classes),
            optimizer=build.create_optimizer(c, first.steps_per_epoch))
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
    """The settings the runs share (they differ in traced values only)."""
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
                         if self.shard == "runs" and self.size > 1 else P())

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

  def keys(self, stream: str) -> jax.Array:
    """Every run's key of ``stream`` (:func:`fkjax.training.build.prng_key`)."""
    keys = [build.prng_key(c.seed, stream) for c in self.configs]
    # Placed from the host: with several processes (a single run's), only
    # host values go onto devices that are not all this process's.
    data = [np.asarray(jax.random.key_data(k)) for k in keys]
    data = np.stack(data) if self.size > 1 else data[0]
    return jax.random.wrap_key_data(self.place_runs(data),
                                    impl=jax.random.key_impl(keys[0]))

  def placed_values(self) -> dict[str, jax.Array]:
    return self.place_runs(dict(self.values))

  def stack(self, states: Sequence[PyTree]) -> PyTree:
    """Single-run states -> one state with a run axis (N > 1), placed."""
    host = [jax.device_get(s) for s in states]
    if self.size == 1:
      return self.place_runs(host[0])
    return self.place_runs(jax.tree.map(lambda *xs: np.stack(xs), *host))

  def unstack(self, state: PyTree) -> list[PyTree]:
    """One state with a run axis -> the single-run states, on the host."""
    host = jax.device_get(state)
    if self.size == 1:
      return [host]
    return [jax.tree.map(lambda x, i=i: x[i], host)
            for i in range(self.size)]

  def step_of(self, state: PyTree) -> int:
    """The global step ``state`` is at (the runs step together)."""
    return int(np.ravel(jax.device_get(state["step"]))[0])

  # ----------------------------------------------------- states, restored

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
        build.init_state(
            exp.model, exp.optimizer,
            build.prng_key(config.seed, "init_params"),
            build.prng_key(config.seed, "init_noise"), image_shape,
            model_init=model_init)
        for exp, config in zip(self.exps, self.configs)])

  def restore(self, checkpointers: Sequence[ckpt_lib.Checkpointer]
              ) -> tuple[int | None, PyTree]:
    """``(step, state)``: every run's checkpoint of the step they resume
    from (:func:`resume_step`), else ``(None, the initial state)``."""
    start = resume_step(checkpointers, self.names, self.steps_per_epoch,
                        self.template.training.checkpoint_every_steps)
    if start is None:
      return None, self.initial_state()
    return start, self.stack([
        ckpt.restore(e.abstract_state(), "latest", step=start)[1]
        for ckpt, e in zip(checkpointers, self.exps)])

  def save(self, checkpointers: Sequence[ckpt_lib.Checkpointer], step: int,
           state: PyTree, val_accuracy: Sequence[float] | None = None
           ) -> None:
    """Every run's checkpoint of ``step`` (with its selection accuracy); a
    run that holds ``step`` already (saved before an interruption: the
    same state) is skipped. Each run's state is given as it lies on the
    devices (a sweep's run sliced there): the checkpointer copies it to
    the host once and writes it while the next steps run."""
    for i, ckpt in enumerate(checkpointers):
      if step in ckpt.all_steps():
        continue
      ckpt.save(step, state if self.size == 1 else self.run_state(state, i),
                val_accuracy=None if val_accuracy is None
                else val_accuracy[i])

  @functools.cached_property
  def run_state(self) -> Callable[[PyTree, int], PyTree]:
    """``run_state(state, i)``: run ``i``'s state, sliced on the devices
    (one program for every ``i``) and replicated over the mesh."""
    return jax.jit(lambda state, i: jax.tree.map(lambda x: x[i], state),
                   out_shardings=parallel.replicated(self.mesh))

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
      # The run's traced coefficient, through the platform's noise (the
      # fused CPU kernel takes its coefficient as a constant: there, the
      # same noise in jnp; fkjax.kernels.ModelKernels.noise_any_coef).
      coef = values["model.noise_coef"]
      noise = build.resolve_kernels(config).noise_any_coef
      inject = lambda out, _, key, std_over: noise(out, coef, key, std_over)
    return build.create_model(
        config, self.exps[0].dataset.num_classes, inject_noise=inject)

  def per_run(self, fn: Callable, in_axes: Sequence[int | None]
              ) -> Callable:
    """``fn`` of one run mapped over the run axis of the arguments whose
    ``in_axes`` is 0: ``jax.vmap``, or for a single run ``fn`` itself."""
    if self.size == 1:
      return fn
    return jax.vmap(fn, in_axes=tuple(in_axes))

  # ------------------------------------------------------- the programs

  def step(self, state, batch, step, base_keys, values):
    """Every run's ``step.make_train_step`` with key ``fold_in(base_key,
    step)``; for N > 1 their stages under ``jax.vmap``, the weight gradient
    outside it (``step.over_runs``). Pure."""
    def parts(values):
      config = self.run_config(values)
      optimizer = build.create_optimizer(config, self.steps_per_epoch)
      return step_lib.train_step_parts(self.run_model(config, values),
                                       optimizer, config)

    if self.size == 1:
      state, metrics = step_lib.one_run(parts(values))(
          state, batch, jax.random.fold_in(base_keys, step))
    else:
      keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(base_keys, step)
      state, metrics = step_lib.over_runs(
          parts, None if self.shared_batch else 0)(state, batch, keys, values)
    return (jax.lax.with_sharding_constraint(state, self.run_sharding()),
            metrics)

  @functools.cached_property
  def train_step(self):
    """``train_step(state, batch, base_keys, step, values) -> (state,
    metrics)``: :meth:`step` on a batch placed by :meth:`place_batch`,
    jitted, donating the state (what benchmarks time and compile alone)."""
    return jax.jit(
        lambda state, batch, base_keys, step, values: self.step(
            state, batch, step, base_keys, values), donate_argnums=(0,))

  def step_program(self, train_input: input_pipeline.TrainInput,
                   base_keys: jax.Array, values: Mapping[str, jax.Array]
                   ) -> Callable[[PyTree, Any, int], tuple[PyTree, PyTree]]:
    """``(state, feed, step) -> (state, metrics)``: :meth:`step` jitted once,
    donating the state, on ``train_input``'s feeds (a batch stream per run:
    the runs' feeds stacked on a leading run axis). The step is a traced
    argument: every step of a run is one compiled program (an epoch's last,
    smaller batch, ``drop_last=False``, compiles a second)."""
    per_run = not self.shared_batch
    sharding = self.batch_sharding(per_run=per_run)
    data = train_input.data(NamedSharding(self.mesh, P()))

    def program(state, data, feed, step, base_keys, values):
      batch = (jax.vmap(train_input.batch, in_axes=(None, 0))(data, feed)
               if per_run else train_input.batch(data, feed))
      batch = jax.lax.with_sharding_constraint(batch, sharding)
      return self.step(state, batch, step, base_keys, values)

    jitted = jax.jit(program, donate_argnums=(0,))
    compiled: dict[Any, Any] = {}

    def run(state, feed, step):
      feed = input_pipeline.put(feed, sharding)
      args = (state, data, feed, step, base_keys, values)
      shapes = tuple((x.shape, x.dtype) for x in jax.tree.leaves(feed))
      if shapes not in compiled:
        # Compiled ahead of its first call, so that a batch that does not
        # fit in memory is refused in one line before anything is allocated.
        compiled[shapes] = jitted.lower(*args).compile()
        self.check_memory(compiled[shapes], at_batch=lambda b: jitted.lower(
            state, data, _feed_of_batch(feed, b, per_run), step, base_keys,
            values).compile())
      return compiled[shapes](*args)
    run.compiled = compiled   # one program per batch shape
    return run

  def check_memory(self, compiled: Any,
                   at_batch: Callable[[int], Any] | None = None) -> None:
    """Raises :class:`fkjax.evaluation.memory.BatchTooLarge` where the
    compiled step would need more memory than the devices have free;
    ``at_batch(b)``: the step compiled at global batch ``b``, for a
    suggested batch that passes this check (one process only: another's
    feed is its own share)."""
    device = self.mesh.devices.flat[0]
    devices = self.mesh.size
    eval_memory.check(
        compiled, self.template.training.batch_size,
        "the training step" + (f" of {self.size} runs" if self.size > 1
                               else ""),
        batch_key="config.training.batch_size", multiple=devices,
        at_batch=at_batch if jax.process_count() == 1 else None,
        # A sweep's runs share the memory: fewer of them at once need less.
        also=(f"or sweep fewer than {self.size} runs at once"
              if self.size > 1 else ""),
        # The CPU's devices share its memory; a GPU's estimate is its own.
        scale=devices if device.platform == "cpu" else 1,
        free=eval_memory.free_bytes(device))

  @functools.cached_property
  def end_of_epoch(self):
    """``end_of_epoch(state, values) -> (state, evaluated variables)``, one
    jitted program: every run's ``step.end_of_epoch`` and
    ``sparsify.eval_variables``."""
    def one(state, values):
      config = self.run_config(values)
      state = step_lib.end_of_epoch(state, config)
      return state, sparsify.eval_variables(state, config)

    def end_of_epoch(state, values):
      state, evaluated = self.per_run(one, (0, 0))(state, values)
      sharding = self.run_sharding()
      return (jax.lax.with_sharding_constraint(state, sharding),
              jax.lax.with_sharding_constraint(evaluated, sharding))
    return jax.jit(end_of_epoch, donate_argnums=(0,))

  @functools.cached_property
  def loss_check(self):
    """``loss_check(variables, images, labels, keys, values) -> [N]``:
    every run's ``step.make_loss_check``."""
    def one(variables, key, values, images, labels):
      config = self.run_config(values)
      loss = step_lib.make_loss_check(self.run_model(config, values))
      return loss(variables, images, labels, key)

    def loss_check(variables, images, labels, keys, values):
      images, labels = self.spread_rows(images, labels)
      return self.per_run(one, (0, 0, 0, None, None))(
          variables, keys, values, images, labels)
    return jax.jit(loss_check)

  def spread_rows(self, *batch: jax.Array) -> tuple[jax.Array, ...]:
    """Inside a program: a validation batch's rows split as a training
    batch's are (:meth:`batch_sharding`), however many rows it has (XLA
    pads the last device's part and leaves the padding out of every
    reduction)."""
    return jax.lax.with_sharding_constraint(batch, self.batch_sharding())

  def eval_batches(self, split: data_lib.Split
                   ) -> Iterator[dict[str, jax.Array] | None]:
    """The validation batches of real rows (None for a batch of padding
    only), from batches padded to split over the mesh
    (:func:`fkjax.training.parallel.eval_batches`; several processes: each
    its own slice); the programs split the real rows again
    (:meth:`spread_rows`)."""
    for batch in parallel.eval_batches(
        split, self.template.validation.batch_size, self.mesh):
      yield eval_loop.real_rows(batch)

  @functools.cached_property
  def validation_counts(self):
    """``counts(variables, images, labels, keys, epoch, batch_index, values)
    -> int32 [N, attacks]``: every run's correct predictions on one batch
    under :func:`fkjax.training.validation.attacks`."""
    def one(variables, val_key, values, images, labels, epoch, batch_index):
      config = self.run_config(values)
      eval_apply, _ = build.model_fns(self.run_model(config, values))
      return validation.correct_counts(
          eval_apply, validation.attacks(config), variables, images, labels,
          jax.random.fold_in(jax.random.fold_in(val_key, epoch),
                             batch_index))

    def counts(variables, images, labels, keys, epoch, batch_index,
               values):
      images, labels = self.spread_rows(images, labels)
      return self.per_run(one, (0, 0, 0, None, None, None, None))(
          variables, keys, values, images, labels, epoch, batch_index)
    return jax.jit(counts)

  def validate(self, evaluated: PyTree, split: data_lib.Split,
               keys: jax.Array, epoch: int, values: Any
               ) -> list[dict[str, float]]:
    """Every run's ``{attack name: accuracy (%)}`` on ``split``, under its
    own keys and attack settings."""
    names = list(validation.attacks(self.template))
    correct = np.zeros((self.size, len(names)), np.int64)
    num_examples = 0
    for batch_index, batch in enumerate(self.eval_batches(split)):
      if batch is None:
        continue
      num_examples += int(batch["label"].shape[0])
      correct += eval_loop.to_host(self.validation_counts(
          evaluated, batch["image"], batch["label"], keys, epoch,
          batch_index, values)).astype(np.int64).reshape(self.size, -1)
    accuracy = 100.0 * correct / max(num_examples, 1)
    return [{name: float(run[j]) for j, name in enumerate(names)}
            for run in accuracy]

  def weights_loss(self, evaluated: PyTree, split: data_lib.Split,
                   keys: jax.Array, values: Any) -> np.ndarray:
    """Every run's clean loss on the first validation batch."""
    batch = next(b for b in self.eval_batches(split) if b is not None)
    return eval_loop.to_host(self.loss_check(
        evaluated, batch["image"], batch["label"], keys, values)).reshape(-1)


def _feed_of_batch(feed: PyTree, batch: int, per_run: bool) -> PyTree:
  """The shapes of ``feed`` (placed) at another batch size: its batch axis
  is the first, after the run axis of a feed per run. Shapes only: what
  compiles the step at that batch allocates nothing."""
  axis = 1 if per_run else 0

  def cut(x):
    shape = list(x.shape)
    shape[axis] = batch
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype,
                                sharding=getattr(x, "sharding", None))
  return jax.tree.map(cut, feed)
