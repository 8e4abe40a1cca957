"""Attacks as the EnResNet authors' attack script runs them, for reproducing
the paper's columns exactly (docs/protocol.md).

``cw_authors`` is the script's C&W (the paper's A4 column): Adam on
``‖w − x‖² + c·max(z_y − max_{j≠y} z_j, −κ)`` from ``w = x``, after which
the perturbation ``w − x`` is *multiplied* by ``scale`` (0.031), not
projected onto the ε ball. The perturbations it makes are tiny (on a small
ResNet8, max |δ| 0.28/255, accuracy at the natural one), which is why the
paper's A4 is above its A2 and A3. fkjax's own C&W column is
:func:`fkjax.attacks.cw_linf`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fkjax.attacks import common


def cw_authors(apply_fn: common.ApplyFn,
               variables: Any,
               images: jax.Array,
               labels: jax.Array,
               key: jax.Array,
               *,
               num_steps: int = 50,
               learning_rate: float = 6e-4,
               c: float = 10.0,
               kappa: float = 0.0,
               scale: float = 0.031) -> jax.Array:
  """The authors' C&W: ``x + scale * (w* − x)``, clipped to [0, 1].

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    images: float array ``[batch, ...]`` in [0, 1].
    labels: int array ``[batch]``.
    key: PRNG key for the model noise (a fresh draw every step).
    num_steps: Adam steps (static).
    learning_rate: Adam's learning rate.
    c: weight of the margin term.
    kappa: confidence: the margin term stops at ``-kappa``.
    scale: the factor the final perturbation is multiplied by.
  """
  optimizer = optax.adam(learning_rate)

  def objective(w, step_key):
    logits = apply_fn(variables, w, step_key).astype(jnp.float32)
    margin = -common.cw_margin(logits, labels)   # z_y - max_{j != y} z_j
    distance = jnp.sum(jnp.square(w - images).reshape(w.shape[0], -1), -1)
    return jnp.sum(distance + c * jnp.maximum(margin, -kappa))

  def step(carry, step_key):
    w, opt_state = carry
    grad = jax.grad(objective)(w, step_key)
    updates, opt_state = optimizer.update(grad, opt_state, w)
    return (optax.apply_updates(w, updates), opt_state), None

  w = images.astype(jnp.float32)
  (w, _), _ = jax.lax.scan(step, (w, optimizer.init(w)),
                           jax.random.split(key, num_steps))
  return jnp.clip(images + scale * (w - images), 0.0, 1.0).astype(
      images.dtype)
