"""Input gradients averaged over the model's noise (EOT).

A model with noise injection gives a different gradient for every noise draw;
attacking a single draw can make a noisy model look more robust than it is.
Expectation over Transformation (Athalye et al., 2018) attacks the expected
loss instead: ``input_gradient`` averages the gradient over ``eot_samples``
independent noise keys, and ``loss_and_gradient`` (used by APGD and by the
best-so-far PGD) returns the averaged loss with it. ``fooled`` judges an
iterate on fresh noise draws, never on the draws its gradient used.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fkjax.attacks import common


def input_gradient(apply_fn: common.ApplyFn,
                   variables: Any,
                   images: jax.Array,
                   labels: jax.Array,
                   key: jax.Array,
                   *,
                   loss: str = "ce",
                   eot_samples: int = 1,
                   targets: jax.Array | None = None) -> jax.Array:
  """Gradient of the summed per-example loss with respect to ``images``.

  The loss is summed, not averaged, over the batch, so an example's gradient
  does not depend on the batch size.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables, passed through to ``apply_fn``.
    images: float array ``[batch, ...]``.
    labels: int array ``[batch]`` of true labels.
    key: PRNG key for the model noise. With ``eot_samples == 1`` it is passed
      to the model as is; otherwise it is split into ``eot_samples`` keys.
    loss: one of ``common.LOSSES``: ``"ce"`` (cross-entropy), ``"cw"``
      (Carlini-Wagner margin), ``"dlr"`` or ``"dlr_targeted"``.
    eot_samples: number of noise draws to average the gradient over (static).
      The draws are evaluated together with ``vmap``, so memory grows with it.
    targets: int ``[batch]`` target classes, for ``"dlr_targeted"`` only.

  Returns:
    Array like ``images``: the gradient, averaged over the noise draws.
  """
  if eot_samples < 1:
    raise ValueError(f"eot_samples must be >= 1, got {eot_samples}.")

  def total_loss(x, noise_key):
    logits = apply_fn(variables, x, noise_key)
    return jnp.sum(common.per_example_loss(loss, logits, labels, targets))

  grad_fn = jax.grad(total_loss)
  if eot_samples == 1:
    return grad_fn(images, key)
  keys = jax.random.split(key, eot_samples)
  grads = jax.vmap(grad_fn, in_axes=(None, 0))(images, keys)
  return jnp.mean(grads, axis=0)


def loss_and_gradient(apply_fn: common.ApplyFn,
                      variables: Any,
                      images: jax.Array,
                      labels: jax.Array,
                      key: jax.Array,
                      *,
                      loss: str = "ce",
                      eot_samples: int = 1,
                      targets: jax.Array | None = None
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-example loss and input gradient, both averaged over the noise draws.

  The same draws as :func:`input_gradient` (same keys, same gradient up to
  float rounding) plus the values an adaptive attack needs: APGD steers its
  step size by the EOT loss, and a deterministic model's logits come for free
  with the gradient.

  Args:
    apply_fn, variables, images, labels, key, loss, eot_samples, targets: as
      in :func:`input_gradient`.

  Returns:
    ``(loss [batch] float32, gradient like images, logits [batch, classes])``;
    the logits are those of the first noise draw.
  """
  if eot_samples < 1:
    raise ValueError(f"eot_samples must be >= 1, got {eot_samples}.")

  def total_loss(x, noise_key):
    logits = apply_fn(variables, x, noise_key)
    per_example = common.per_example_loss(loss, logits, labels, targets)
    return jnp.sum(per_example), (per_example, logits)

  grad_fn = jax.grad(total_loss, has_aux=True)
  if eot_samples == 1:
    grad, (per_example, logits) = grad_fn(images, key)
    return per_example, grad, logits
  keys = jax.random.split(key, eot_samples)
  grads, (per_example, logits) = jax.vmap(grad_fn, in_axes=(None, 0))(images,
                                                                      keys)
  return jnp.mean(per_example, axis=0), jnp.mean(grads, axis=0), logits[0]


def fooled(apply_fn: common.ApplyFn,
           variables: Any,
           images: jax.Array,
           labels: jax.Array,
           key: jax.Array,
           draws: int,
           logits: jax.Array | None = None) -> jax.Array:
  """Bool ``[batch]``: whether ``images`` fool the model on every draw.

  Args:
    apply_fn, variables, images, labels: as in :func:`input_gradient`.
    key: PRNG key for the fresh noise draws; pass one the gradient did not
      use, or a lucky draw shared with the gradient would count twice.
    draws: number of fresh noise draws (static) that must ALL misclassify an
      image. ``0`` skips the forward pass and judges ``logits`` instead:
      exact, and free, for a deterministic model.
    logits: the logits to judge when ``draws == 0``.

  Returns:
    bool array ``[batch]``.
  """
  if draws == 0:
    if logits is None:
      raise ValueError("draws=0 judges given logits; pass them")
    return common.misclassified(logits, labels)
  if draws < 0:
    raise ValueError(f"draws must be >= 0, got {draws}.")
  if draws == 1:
    return common.misclassified(apply_fn(variables, images, key), labels)
  keys = jax.random.split(key, draws)
  wrong = jax.vmap(lambda k: common.misclassified(
      apply_fn(variables, images, k), labels))(keys)
  return jnp.all(wrong, axis=0)
