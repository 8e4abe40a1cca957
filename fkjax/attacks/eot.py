"""Input gradients averaged over the model's noise (EOT).

A model with noise injection gives a different gradient for every noise draw;
attacking a single draw can make a noisy model look more robust than it is.
Expectation over Transformation (Athalye et al., 2018) attacks the expected
loss instead: ``input_gradient`` averages the gradient over ``eot_samples``
independent noise keys.
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
                   eot_samples: int = 1) -> jax.Array:
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
    loss: ``"ce"`` (cross-entropy) or ``"cw"`` (Carlini-Wagner margin).
    eot_samples: number of noise draws to average the gradient over (static).
      The draws are evaluated together with ``vmap``, so memory grows with it.

  Returns:
    Array like ``images``: the gradient, averaged over the noise draws.
  """
  if eot_samples < 1:
    raise ValueError(f"eot_samples must be >= 1, got {eot_samples}.")
  per_example_loss = common.loss_fn(loss)

  def total_loss(x, noise_key):
    logits = apply_fn(variables, x, noise_key)
    return jnp.sum(per_example_loss(logits, labels))

  grad_fn = jax.grad(total_loss)
  if eot_samples == 1:
    return grad_fn(images, key)
  keys = jax.random.split(key, eot_samples)
  grads = jax.vmap(grad_fn, in_axes=(None, 0))(images, keys)
  return jnp.mean(grads, axis=0)
