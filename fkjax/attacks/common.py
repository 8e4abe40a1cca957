"""Shared pieces of the attacks: the model contract, losses and the projection.

Every attack takes a model as ``apply_fn(variables, images, key) -> logits``.
``key`` drives the model's own noise (noise injection); a deterministic model
ignores it. Images are float arrays with values in [0, 1] and the batch on the
leading axis; the attacks never look at the remaining axes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

ApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
"""``apply_fn(variables, images, key) -> logits``, ``[batch, classes]``."""

LOSSES = ("ce", "cw")


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy, computed in float32."""
  return optax.losses.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels)


def cw_margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example Carlini-Wagner margin ``max_{j != y} z_j - z_y``.

  Positive exactly when the example is misclassified, so an attack maximises
  it. Unlike the cross-entropy it does not saturate for confident models.
  """
  logits = logits.astype(jnp.float32)
  num_classes = logits.shape[-1]
  true_mask = jax.nn.one_hot(labels, num_classes, dtype=jnp.bool_)
  true_logit = jnp.sum(jnp.where(true_mask, logits, 0.0), axis=-1)
  best_other = jnp.max(jnp.where(true_mask, -jnp.inf, logits), axis=-1)
  return best_other - true_logit


def loss_fn(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """The per-example loss an attack maximises: ``"ce"`` or ``"cw"``."""
  if name == "ce":
    return cross_entropy
  if name == "cw":
    return cw_margin
  raise ValueError(f"Unknown attack loss {name!r}; expected one of {LOSSES}.")


def project(x_adv: jax.Array, images: jax.Array, epsilon: float) -> jax.Array:
  """Projects ``x_adv`` onto the l_inf ball of radius ``epsilon`` and [0, 1].

  Clipping to the ball first and to the box second keeps both constraints:
  the box clip only moves a coordinate towards ``images``, which lies in the
  box. The result has ``images``' dtype.
  """
  x_adv = jnp.clip(x_adv.astype(images.dtype), images - epsilon,
                   images + epsilon)
  return jnp.clip(x_adv, 0.0, 1.0)


# Drawing random numbers in a flat array and reshaping compiles several times
# faster on XLA:CPU than drawing them in a rank-4/5 shape (measured 0.24 s vs
# 1.85 s for 115200 normals), with the same distribution.
def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Standard normal float32 samples of ``shape``."""
  size = math.prod(shape)
  return jax.random.normal(key, (size,), jnp.float32).reshape(shape)


def uniform(key: jax.Array, shape: tuple[int, ...], minval: float,
            maxval: float) -> jax.Array:
  """Uniform float32 samples in ``[minval, maxval)`` of ``shape``."""
  size = math.prod(shape)
  return jax.random.uniform(key, (size,), jnp.float32, minval,
                            maxval).reshape(shape)
