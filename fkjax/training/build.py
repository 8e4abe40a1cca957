"""What a run builds from its config: data, model, optimizer, state, keys.

``Experiment.build(config)`` validates the config, loads the data and makes
the mesh, the model and the optimizer; ``train.py`` and ``eval.py`` both
start from it. Every random stream of a run comes from its one ``seed``
through :func:`prng_key`, each under its own name. The sparsifier of
``config.sparsity`` is :mod:`fkjax.training.sparsify`'s.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax import kernels
from fkjax import models
from fkjax.config import record as run_config
from fkjax.evaluation import memory as eval_memory
from fkjax.training import parallel
from fkjax.training import precision
from fkjax.training import sparsify

PyTree = Any

# The named random streams of a run (see prng_key).
STREAMS = ("init_params", "init_noise", "train", "validation", "test")


def prng_key(seed: int, stream: str) -> jax.Array:
  """The PRNG key of one named stream of the run with ``seed``.

  Each stream is ``fold_in(key(seed), crc32(name))``: streams of one run are
  independent, and no stream of seed ``s`` is a stream of seed ``s + 1``.
  """
  if stream not in STREAMS:
    raise ValueError(f"unknown PRNG stream {stream!r}; one of {STREAMS}")
  return jax.random.fold_in(jax.random.key(seed),
                            zlib.crc32(stream.encode()) & 0x7FFFFFFF)


def resolve_kernels(config: ml_collections.ConfigDict
                    ) -> kernels.ModelKernels:
  """``config.kernels`` resolved for ``config.model`` (see
  :func:`fkjax.kernels.resolve`)."""
  return kernels.resolve(config.get("kernels"),
                         ensemble_size=config.model.ensemble_size,
                         noise=bool(config.model.noise_coef))


def create_model(config: ml_collections.ConfigDict, num_classes: int,
                 inject_noise: Callable | None = None):
  """The model of ``config.model``, running ``config.kernels``' kernels, in
  true float32 (:func:`fkjax.training.precision.evaluation_model`; a
  training step takes ``config.precision``).

  ``inject_noise`` replaces the resolved noise kernel (a sweep passes one
  whose coefficient is its run's traced value, :mod:`fkjax.training.sweep`).
  """
  m = config.model
  kwargs = resolve_kernels(config).model_kwargs
  if inject_noise is not None:
    kwargs["inject_noise"] = inject_noise
  return precision.evaluation_model(models.create_model(
      depth=m.depth, num_classes=num_classes, ensemble_size=m.ensemble_size,
      width=m.width, skip=m.skip, noise_coef=m.noise_coef,
      noise_std_over=m.noise_std_over, normalize=m.normalize, **kwargs))


def data_seed(config: ml_collections.ConfigDict) -> int:
  """The seed of the training data's order and augmentation:
  ``config.training.data_seed``, else the run's ``seed``."""
  seed = config.training.get("data_seed")
  return config.seed if seed is None else seed


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
  return sparsify.sparsifier(config).optimizer(
      learning_rate_schedule(config, steps_per_epoch), momentum=t.momentum,
      nesterov=t.nesterov, weight_decay=t.weight_decay)


def init_state(model, optimizer: optax.GradientTransformation,
               params_key: jax.Array, noise_key: jax.Array | None = None,
               image_shape=(32, 32, 3),
               model_init: Callable | None = None) -> dict[str, PyTree]:
  """The training state: a plain dict, which orbax saves as is.

  ``model_init``: a jitted ``functools.partial(model.init, train=False)`` to
  reuse (a sweep initialises its runs with one compiled program).
  """
  if noise_key is None:
    params_key, noise_key = jax.random.split(params_key)
  if model_init is None:
    model_init = jax.jit(functools.partial(model.init, train=False))
  variables = model_init({"params": params_key, "noise": noise_key},
                         jnp.zeros((1, *image_shape), jnp.float32))
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


def load_dataset(config: ml_collections.ConfigDict) -> data_lib.Dataset:
  d = config.dataset
  if d.source == "synthetic":
    eval_memory.check_synthetic_sizes(tuple(d.synthetic_sizes))
  return data_lib.load_dataset(
      d.name, d.source, d.data_dir, val_size=d.val_size,
      split_seed=d.split_seed, subset_per_class=d.subset_per_class,
      test_subset_per_class=d.test_subset_per_class,
      synthetic_sizes=tuple(d.synthetic_sizes),
      tfds_data_dir=d.tfds_data_dir, download=d.get("download", True))


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
    run_config.validate(config)
    mesh = parallel.make_mesh(config.num_devices or None)
    parallel.check_batch_size(config.training.batch_size, mesh)
    dataset = load_dataset(config)
    t = config.training
    n = len(dataset.train.labels)
    steps = data_lib.steps_per_epoch(n, t.batch_size, t.drop_last)
    rest = n % t.batch_size
    if not t.drop_last and rest % mesh.size:
      raise run_config.ConfigError(
          f"the last training batch ({rest} of {n} images) does not divide "
          f"over {mesh.size} devices: set config.training.drop_last=True")
    if config.validation.split == "val" and not len(dataset.val.labels):
      raise run_config.ConfigError(
          "config.validation.split='val' but config.dataset.val_size=0 "
          "leaves no validation split: set validation.split='test' (the "
          "authors' protocol) or a val_size")
    model = create_model(config, dataset.num_classes)
    return cls(config, dataset, model, create_optimizer(config, steps),
               steps, mesh)

  def _init(self) -> dict[str, PyTree]:
    seed = self.config.seed
    return init_state(self.model, self.optimizer,
                      prng_key(seed, "init_params"),
                      prng_key(seed, "init_noise"),
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
