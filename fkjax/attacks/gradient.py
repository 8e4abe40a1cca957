"""Gradient attacks in l_inf: FGSM, PGD (IFGSM^M) and C&W-l_inf.

``pgd(return_best=True)`` counts an image as broken if ANY iterate fooled
the model and returns that iterate (best-so-far, as AutoAttack counts); the
default ``return_best=False`` returns the final iterate, which is what the
training step uses (and must keep using: its numbers do not change).
``sweep_step_size`` scales the step with epsilon for epsilon sweeps.

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


def sweep_step_size(epsilon: float, num_steps: int,
                    travel: float = 2.5) -> float:
  """Step size for an epsilon sweep: ``travel * epsilon / num_steps``.

  A fixed step (e.g. 2/255) cannot cross a large ball in a few steps, so a
  sweep with it never reaches 0% and looks like robustness. With this step
  the attack can travel ``travel`` ball radii in ``num_steps`` steps whatever
  epsilon is (2.5 is Madry et al.'s choice).
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
  return travel * epsilon / num_steps


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
        unroll: int = 1,
        return_best: bool = False,
        check_draws: int = 1) -> jax.Array:
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
    loss: ``"ce"`` (IFGSM/PGD), ``"cw"`` (C&W margin) or ``"dlr"``, static.
    eot_samples: noise draws each gradient is averaged over (static).
    unroll: steps written out per ``lax.scan`` iteration (static int >= 1):
      1 compiles once whatever ``num_steps``; ``unroll >= num_steps`` writes
      every step out (fastest on XLA:CPU with some convolutions; compile
      time grows with ``num_steps``).
    return_best: ``False`` (the training attack) returns the final iterate.
      ``True`` (evaluation) checks every iterate from the start on and
      returns, for each image, the highest-loss iterate that fooled the
      model, or the final iterate if none did (the evaluation judges that
      one). Costs ``check_draws`` forward passes per step (none with
      ``check_draws=0``). Static.
    check_draws: with ``return_best``, fresh noise draws an iterate must
      fool, all of them, to count (``eot.fooled``); ``0`` judges the logits
      of the gradient's first draw instead: free and exact for a
      deterministic model, too lenient for a noisy one. Static.

  Returns:
    Adversarial images, same shape and dtype as ``images``.
  """
  if return_best:
    return _pgd_best(apply_fn, variables, images, labels, key,
                     epsilon=epsilon, step_size=step_size,
                     num_steps=num_steps, random_start=random_start,
                     loss=loss, eot_samples=eot_samples, unroll=unroll,
                     check_draws=check_draws)
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

  _check_unroll(unroll)
  if unroll >= num_steps:
    for i in range(num_steps):
      x_adv = step(x_adv, step_keys[i])
    return x_adv
  x_adv, _ = jax.lax.scan(lambda x, k: (step(x, k), None), x_adv, step_keys,
                          unroll=unroll)
  return x_adv


def _check_unroll(unroll: int) -> None:
  if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
    raise ValueError(f"unroll must be an int >= 1 (steps written out per "
                     f"scan iteration), got {unroll!r}")


def _pgd_best(apply_fn, variables, images, labels, key, *, epsilon,
              step_size, num_steps, random_start, loss, eot_samples, unroll,
              check_draws):
  """``pgd`` with best-so-far tracking; same start and gradient keys."""
  start_key, steps_key = jax.random.split(key)
  x = images
  if random_start:
    noise = common.uniform(start_key, images.shape, -epsilon, epsilon)
    x = common.project(images + noise, images, epsilon)
  # The gradients use exactly pgd's keys; the checks get their own stream.
  step_keys = jax.random.split(steps_key, max(num_steps, 1))
  check_keys = jax.random.split(jax.random.fold_in(key, 1), max(num_steps, 1))
  batch_shape = (-1,) + (1,) * (images.ndim - 1)

  def record(best, x, value, wrong):
    best_x, best_value, any_wrong = best
    better = jnp.logical_and(wrong, value > best_value)
    best_x = jnp.where(better.reshape(batch_shape), x, best_x)
    best_value = jnp.where(better, value, best_value)
    return best_x, best_value, jnp.logical_or(any_wrong, wrong)

  def step(carry, keys):
    x, best = carry
    step_key, check_key = keys
    value, grad, logits = eot.loss_and_gradient(
        apply_fn, variables, x, labels, step_key, loss=loss,
        eot_samples=eot_samples)
    wrong = eot.fooled(apply_fn, variables, x, labels, check_key,
                       check_draws, logits)
    best = record(best, x, value, wrong)
    x_next = common.project(x + step_size * jnp.sign(grad), images, epsilon)
    return (x_next, best), None

  best = (x, jnp.full(labels.shape, -jnp.inf, jnp.float32),
          jnp.zeros(labels.shape, jnp.bool_))
  carry = (x, best)
  _check_unroll(unroll)
  if unroll >= num_steps:
    for i in range(num_steps):
      carry, _ = step(carry, (step_keys[i], check_keys[i]))
  else:
    carry, _ = jax.lax.scan(step, carry,
                            (step_keys[:num_steps], check_keys[:num_steps]),
                            unroll=unroll)
  x, best = carry
  # The final iterate needs no check of its own: it is returned whenever no
  # earlier iterate fooled the model, and the evaluation judges it anyway.
  best_x, _, any_wrong = best
  return jnp.where(any_wrong.reshape(batch_shape), best_x, x)


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
            unroll: int = 1,
            return_best: bool = False,
            check_draws: int = 1) -> jax.Array:
  """C&W attack in l_inf: ``pgd`` on the margin ``max_{j != y} z_j - z_y``.

  The paper leaves the C&W settings open; the default is 20 steps of 2/255
  from a random start in the epsilon = 8/255 ball: the budget of IFGSM^20, on
  the margin loss. See ``pgd`` for the arguments.
  """
  return pgd(apply_fn, variables, images, labels, key, epsilon=epsilon,
             step_size=step_size, num_steps=num_steps,
             random_start=random_start, loss="cw", eot_samples=eot_samples,
             unroll=unroll, return_best=return_best, check_draws=check_draws)
