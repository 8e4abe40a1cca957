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

LOSSES = ("ce", "cw", "dlr", "dlr_targeted")
"""Per-example losses an attack can maximise (see :func:`per_example_loss`)."""

# DLR's denominators: keeps a division by a zero logit spread finite.
_DLR_EPS = 1e-12


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy, computed in float32."""
  return optax.losses.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels)


def _true_logit_and_best_other(logits: jax.Array, labels: jax.Array
                               ) -> tuple[jax.Array, jax.Array]:
  num_classes = logits.shape[-1]
  true_mask = jax.nn.one_hot(labels, num_classes, dtype=jnp.bool_)
  true_logit = jnp.sum(jnp.where(true_mask, logits, 0.0), axis=-1)
  best_other = jnp.max(jnp.where(true_mask, -jnp.inf, logits), axis=-1)
  return true_logit, best_other


def cw_margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example Carlini-Wagner margin ``max_{j != y} z_j - z_y``.

  Positive exactly when the example is misclassified, so an attack maximises
  it. Unlike the cross-entropy it does not saturate for confident models.
  """
  true_logit, best_other = _true_logit_and_best_other(
      logits.astype(jnp.float32), labels)
  return best_other - true_logit


def _check_classes(logits: jax.Array, needed: int, name: str) -> None:
  if logits.shape[-1] < needed:
    raise ValueError(f"the {name} loss needs at least {needed} classes, got "
                     f"{logits.shape[-1]}")


def dlr(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Difference of Logits Ratio (Croce & Hein, 2020), per example.

  ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3 + 1e-12)``, where ``z_pi1 >=
  z_pi2 >= ...`` are the sorted logits. Dividing by a spread of the logits
  makes the loss invariant to shifting and rescaling them, so a model cannot
  hide behind saturated or rescaled logits. Positive exactly when the example
  is misclassified. Needs at least 3 classes.
  """
  _check_classes(logits, 3, "DLR")
  logits = logits.astype(jnp.float32)
  true_logit, best_other = _true_logit_and_best_other(logits, labels)
  top = jax.lax.top_k(logits, 3)[0]
  return -(true_logit - best_other) / (top[..., 0] - top[..., 2] + _DLR_EPS)


def dlr_targeted(logits: jax.Array, labels: jax.Array,
                 targets: jax.Array) -> jax.Array:
  """Targeted DLR (APGD-T), per example.

  ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2 + 1e-12)`` for the target
  class ``t``: maximising it pushes the target logit above the true one.
  Needs at least 4 classes.
  """
  _check_classes(logits, 4, "targeted DLR")
  logits = logits.astype(jnp.float32)
  pick = lambda c: jnp.take_along_axis(logits, c[..., None], axis=-1)[..., 0]
  top = jax.lax.top_k(logits, 4)[0]
  spread = top[..., 0] - 0.5 * (top[..., 2] + top[..., 3]) + _DLR_EPS
  return -(pick(labels) - pick(targets)) / spread


def per_example_loss(name: str, logits: jax.Array, labels: jax.Array,
                     targets: jax.Array | None = None) -> jax.Array:
  """The loss ``name`` (one of :data:`LOSSES`) of every example.

  ``targets`` (int ``[batch]``) is required by ``"dlr_targeted"`` and
  ignored by the others.
  """
  if name == "dlr_targeted":
    if targets is None:
      raise ValueError("the dlr_targeted loss needs target classes")
    return dlr_targeted(logits, labels, targets)
  return loss_fn(name)(logits, labels)


def loss_fn(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """The untargeted per-example loss ``"ce"``, ``"cw"`` or ``"dlr"``."""
  if name == "ce":
    return cross_entropy
  if name == "cw":
    return cw_margin
  if name == "dlr":
    return dlr
  raise ValueError(f"Unknown untargeted attack loss {name!r}; expected one of "
                   f"{LOSSES[:3]} (dlr_targeted needs targets: "
                   "per_example_loss).")


def misclassified(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Bool ``[batch]``: whether the arg-max class differs from the label."""
  return jnp.argmax(logits, axis=-1) != labels


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
