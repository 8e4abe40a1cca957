"""Gradient attacks in l_inf: FGSM, PGD (IFGSM^M) and C&W-l_inf.

All arguments after ``key`` are static: wrap the attack in ``functools.partial``
before ``jax.jit``, e.g. ``jax.jit(functools.partial(pgd, apply_fn,
num_steps=20))``.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fkjax.attacks import common
from fkjax.attacks import eot


def fgsm(apply_fn: common.ApplyFn,
         variables: Any,
         images: jax.Array,
         labels: jax.Array,
         key: jax.Array,
         *,
         epsilon: float = 8 / 255,
         eot_samples: int = 1) -> jax.Array:
  """Fast gradient sign method: one signed-gradient step of size ``epsilon``.

  ``x_adv = clip(x + epsilon * sign(grad_x CE(x, y)), 0, 1)``.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    images: float array ``[batch, ...]`` with values in [0, 1].
    labels: int array ``[batch]``, the true labels.
    key: PRNG key for the model noise.
    epsilon: l_inf radius.
    eot_samples: noise draws the gradient is averaged over (static).

  Returns:
    Adversarial images, same shape and dtype as ``images``.
  """
  grad = eot.input_gradient(apply_fn, variables, images, labels, key,
                            loss="ce", eot_samples=eot_samples)
  return common.project(images + epsilon * jnp.sign(grad), images, epsilon)


def pgd(apply_fn: common.ApplyFn,
        variables: Any,
        images: jax.Array,
        labels: jax.Array,
        key: jax.Array,
        *,
        epsilon: float = 8 / 255,
        step_size: float = 2 / 255,
        num_steps: int = 10,
        random_start: bool = True,
        loss: str = "ce",
        eot_samples: int = 1,
        unroll: bool | int = True) -> jax.Array:
  """Projected gradient descent in l_inf (IFGSM^M of the paper).

  Repeats ``x <- Proj(x + step_size * sign(grad_x loss(x, y)))`` ``num_steps``
  times, projecting onto the ``epsilon`` ball around ``images`` and onto
  [0, 1] after every step. Every step draws fresh model noise.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    images: float array ``[batch, ...]`` with values in [0, 1].
    labels: int array ``[batch]``, the true labels.
    key: PRNG key for the random start and the model noise.
    epsilon: l_inf radius.
    step_size: the step ``alpha``.
    num_steps: ``M``, the number of steps (static).
    random_start: start from a point drawn uniformly in the ball (clipped to
      the box) instead of from ``images``.
    loss: ``"ce"`` (IFGSM/PGD) or ``"cw"`` (C&W margin), static.
    eot_samples: noise draws each gradient is averaged over (static).
    unroll: ``True`` writes the steps out in the trace: fastest to run on
      XLA:CPU but compile time grows with ``num_steps``. ``False`` or an int
      ``n`` uses a ``lax.scan`` unrolled ``n`` times (``False`` = 1): compiles
      once whatever ``num_steps`` is. Static.

  Returns:
    Adversarial images, same shape and dtype as ``images``.
  """
  start_key, steps_key = jax.random.split(key)
  x_adv = images
  if random_start:
    noise = common.uniform(start_key, images.shape, -epsilon, epsilon)
    x_adv = common.project(images + noise, images, epsilon)
  if num_steps <= 0:
    return x_adv
  step_keys = jax.random.split(steps_key, num_steps)

  def step(x, step_key):
    grad = eot.input_gradient(apply_fn, variables, x, labels, step_key,
                              loss=loss, eot_samples=eot_samples)
    return common.project(x + step_size * jnp.sign(grad), images, epsilon)

  if unroll is True:
    for i in range(num_steps):
      x_adv = step(x_adv, step_keys[i])
    return x_adv
  x_adv, _ = jax.lax.scan(lambda x, k: (step(x, k), None), x_adv, step_keys,
                          unroll=max(1, int(unroll)))
  return x_adv


def cw_linf(apply_fn: common.ApplyFn,
            variables: Any,
            images: jax.Array,
            labels: jax.Array,
            key: jax.Array,
            *,
            epsilon: float = 8 / 255,
            step_size: float = 2 / 255,
            num_steps: int = 20,
            random_start: bool = True,
            eot_samples: int = 1,
            unroll: bool | int = True) -> jax.Array:
  """C&W attack in l_inf: ``pgd`` on the margin ``max_{j != y} z_j - z_y``.

  The paper leaves the C&W settings open; the default is 20 steps of 2/255
  from a random start in the epsilon = 8/255 ball: the budget of IFGSM^20, on
  the margin loss. See ``pgd`` for the arguments.
  """
  return pgd(apply_fn, variables, images, labels, key, epsilon=epsilon,
             step_size=step_size, num_steps=num_steps,
             random_start=random_start, loss="cw", eot_samples=eot_samples,
             unroll=unroll)
