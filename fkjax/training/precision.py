"""The precision of a run's arithmetic (``config.precision``), explicit.

* ``"auto"`` (the default): ``"tf32"`` on GPUs and TPUs, ``"float32"`` on
  CPUs (:data:`AUTO`): on a GPU, the convolutions PyTorch (the authors'
  code) runs by default. A run resolves it when it starts
  (:func:`resolved`) and records the precision it took.
* ``"float32"`` (the paper's): float32 values, and every matmul and
  convolution at ``lax.Precision.HIGHEST``, true float32 on every backend
  (JAX's default precision is TF32 on NVIDIA Ampere and newer GPUs and one
  bfloat16 pass on TPUs). On a GPU it runs on the CUDA cores, not the
  tensor cores: an H100 SXM's datasheet gives 67 TFLOP/s for float32
  against 495 for TF32 (dense).
* ``"tf32"``: float32 values, matmuls and convolutions at
  ``lax.Precision.HIGH``: TF32 on NVIDIA Ampere and newer GPUs, three
  bfloat16 passes on TPUs, float32 elsewhere (CPUs).
* ``"bfloat16"``: a training step's forward and backward passes (the
  attack's and the update's) compute in bfloat16, while the weights, their
  gradients, the optimizer state, the BatchNorm statistics, the logits and
  the loss stay float32.

The model a run applies is :class:`ComputeIn`: it traces the model under its
matmul precision (``jax.default_matmul_precision``, which JAX writes into
each matmul and convolution, their gradients included) and, for bfloat16,
casts the parameters and the input on the way in and the logits and
statistics on the way out. The training step takes ``config.precision``
(:func:`training_model`); validation and evaluation run in float32 whatever
the setting (:func:`evaluation_model`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import copy

import jax
import jax.numpy as jnp
import ml_collections

from fkjax.kernels import platforms

PyTree = Any


class Precision(NamedTuple):
  """One ``config.precision``: the compute dtype, JAX's matmul precision
  name and what a log says of it."""
  dtype: Any
  matmul_precision: str
  description: str


PRECISIONS = {
    "float32": Precision(jnp.float32, "highest",
                         "float32 (matmuls and convolutions at HIGHEST)"),
    "tf32": Precision(jnp.float32, "high",
                      "tf32 (float32 values; matmuls and convolutions at "
                      "HIGH: TF32 on GPUs that have it, as PyTorch's "
                      "convolutions by default; precision=float32 computes "
                      "them in true float32, without a GPU's tensor cores: "
                      "67 TFLOP/s on an H100 against 495 in TF32)"),
    "bfloat16": Precision(jnp.bfloat16, "default",
                          "bfloat16 (bfloat16 compute; float32 weights, "
                          "optimizer, statistics and loss)"),
}


# What ``"auto"`` is on each platform (fkjax.kernels.platforms: JAX's
# backend, or FKJAX_KERNELS_PLATFORM's forced one).
AUTO = {"cpu": "float32", "gpu": "tf32", "tpu": "tf32"}
# What config.precision accepts.
CHOICES = ("auto", *PRECISIONS)


def name_of(config: ml_collections.ConfigDict) -> str:
  """``config.precision`` with ``"auto"`` resolved for this platform
  (``"float32"`` where a record has none)."""
  name = config.get("precision") or "float32"
  return AUTO[platforms.platform()] if name == "auto" else name


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` with ``precision="auto"`` replaced by the precision it
  takes here (a copy; ``config`` itself where there is nothing to
  replace): what a run records, compares on resume and logs."""
  if config.get("precision") != "auto":
    return config
  config = copy.deepcopy(config)
  resolve(config)
  return config


def resolve(config: ml_collections.ConfigDict) -> None:
  """:func:`resolved` in ``config`` itself, for a caller that owns it (no
  copy: a ConfigDict's deep copy costs ~2 ms, and a table's plan resolves
  every run's config)."""
  if config.get("precision") == "auto":
    with config.unlocked():
      config.precision = name_of(config)


def describe(config: ml_collections.ConfigDict) -> str:
  """What a training log says of ``config.precision``, e.g.
  ``"float32 (matmuls and convolutions at HIGHEST)"``."""
  return PRECISIONS[name_of(config)].description


def _cast_floats(tree: PyTree, dtype) -> PyTree:
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, tree)


class ComputeIn:
  """``model`` computing in precision ``name``; its ``init`` and ``apply``
  take and return what the float32 model's do (float32 variables, logits
  and statistics). Other attributes are the model's."""

  def __init__(self, model, name: str):
    self.model, self.name = model, name
    self.precision = PRECISIONS[name]

  def init(self, *args, **kwargs) -> Any:
    # Initialisers draw float32 variables whatever the compute dtype.
    with jax.default_matmul_precision(self.precision.matmul_precision):
      return self.model.init(*args, **kwargs)

  def apply(self, variables: PyTree, x: jax.Array, *args,
            mutable: Any = False, **kwargs) -> Any:
    dtype = self.precision.dtype
    if dtype != jnp.float32:
      variables = {**variables,
                   "params": _cast_floats(variables["params"], dtype)}
      x = x.astype(dtype)
    with jax.default_matmul_precision(self.precision.matmul_precision):
      out = self.model.apply(variables, x, *args, mutable=mutable, **kwargs)
    if dtype == jnp.float32:
      return out
    if mutable:
      logits, updated = out
      return logits.astype(jnp.float32), _cast_floats(updated, jnp.float32)
    return out.astype(jnp.float32)

  def __getattr__(self, name: str) -> Any:
    # Only what this object does not have; none while unpickling.
    try:
      model = self.__dict__["model"]
    except KeyError:
      raise AttributeError(name) from None
    return getattr(model, name)


def _unwrapped(model):
  return model.model if isinstance(model, ComputeIn) else model


def training_model(model, config: ml_collections.ConfigDict) -> ComputeIn:
  """The model a training step applies: ``model`` in ``config.precision``."""
  return ComputeIn(_unwrapped(model), name_of(config))


def evaluation_model(model) -> ComputeIn:
  """``model`` in true float32: what validation and evaluation apply."""
  return ComputeIn(_unwrapped(model), "float32")
