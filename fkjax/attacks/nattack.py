"""NAttack (Li et al., 2019): a gradient-free, score-based l_inf attack.

For every image NAttack keeps a Gaussian search distribution ``N(mu, sigma^2)``
over perturbations in tanh space, ``x' = Proj((tanh(arctanh(2x - 1) + z) +
1) / 2)``, and moves ``mu`` with natural evolution strategies: it samples a
population of perturbations, scores each by the clipped logit margin
``max(z_y - max_{j != y} z_j, 0)`` and steps along the reward-weighted mean of
the samples. It only evaluates the model, never differentiates it, so gradient
masking does not stop it.

The defaults are those of the authors' code (population 300, sigma 0.1,
learning rate 0.02, 500 iterations, ``mu`` initialised at N(0, 0.001^2)).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from fkjax.attacks import common

# arctanh(+-1) is infinite; shrinking [-1, 1] slightly keeps pixels at 0 or 1
# finite, as the reference implementation does.
_TANH_SHRINK = 1.0 - 1e-6


def _margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``z_y - max_{j != y} z_j``: positive while the example is classified right.

  Equal to ``log p_y - max_{j != y} log p_j``, the reference code's score.
  """
  return -common.cw_margin(logits, labels)


def nattack(apply_fn: common.ApplyFn,
            variables: Any,
            images: jax.Array,
            labels: jax.Array,
            key: jax.Array,
            *,
            epsilon: float = 8 / 255,
            population: int = 300,
            sigma: float = 0.1,
            learning_rate: float = 0.02,
            max_iters: int = 500,
            chunk: int | None = None,
            image_chunk: int | None = None) -> jax.Array:
  """Runs NAttack on a batch; each image stops as soon as it is misclassified.

  Every iteration first classifies the current mean candidate of each image;
  an image it fools is marked done and its search distribution frozen (so the
  returned image is the one that fooled the model). The loop, a
  ``lax.while_loop``, ends when every image is done or after ``max_iters``
  iterations. Done images still go through the model (static shapes) but
  their updates are discarded.

  Memory: one iteration draws ``population * batch`` perturbations and
  evaluates as many images (``chunk * batch`` with ``chunk``); with
  ``image_chunk`` the batch is attacked that many images at a time, so both
  scale with ``image_chunk`` instead of ``batch``. Each image's search is its
  own, so chunking images changes only which random numbers it draws.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``. Never
      differentiated.
    variables: the model variables.
    images: float array ``[batch, ...]`` with values in [0, 1].
    labels: int array ``[batch]``, the true labels.
    key: PRNG key for the search noise and the model noise.
    epsilon: l_inf radius.
    population: samples per image and iteration (static).
    sigma: standard deviation of the search distribution, in tanh space.
    learning_rate: NES step size.
    max_iters: iteration limit (static).
    chunk: if set, the population is evaluated ``chunk`` members at a time
      (``vmap`` inside a ``lax.map``) to bound memory; ``None`` evaluates all
      of it in one ``vmap``. Static.
    image_chunk: if set, images are attacked this many at a time (a
      ``lax.map`` over groups, the last one padded); ``None`` attacks the
      whole batch at once. Static.

  Returns:
    Adversarial images, same shape and dtype as ``images``.
  """
  if population < 2:
    raise ValueError(f"population must be >= 2, got {population}.")
  num_images = images.shape[0]
  if image_chunk is not None and num_images > image_chunk:
    pad = -num_images % image_chunk
    # Padding repeats the first image; its copies' results are dropped.
    grouped = [jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]).reshape(
        (-1, image_chunk) + x.shape[1:]) for x in (images, labels)]
    keys = jax.random.split(key, grouped[0].shape[0])
    attack_group = functools.partial(
        nattack, apply_fn, variables, epsilon=epsilon, population=population,
        sigma=sigma, learning_rate=learning_rate, max_iters=max_iters,
        chunk=chunk)
    adversarial = jax.lax.map(lambda a: attack_group(*a), (*grouped, keys))
    return adversarial.reshape((-1,) + images.shape[1:])[:num_images]
  images_f32 = images.astype(jnp.float32)
  tanh_images = jnp.arctanh((2.0 * images_f32 - 1.0) * _TANH_SHRINK)

  def to_image(perturbation):
    candidate = (jnp.tanh(tanh_images + perturbation) + 1.0) / 2.0
    return common.project(candidate, images, epsilon)

  def evaluate_member(member_images, member_key):
    return apply_fn(variables, member_images, member_key)

  def population_margins(samples, pop_key):
    # samples: [population, batch, ...] -> margins [population, batch].
    candidates = to_image(samples)
    member_keys = jax.random.split(pop_key, population)
    if chunk is None:
      logits = jax.vmap(evaluate_member)(candidates, member_keys)
    else:
      logits = jax.lax.map(lambda a: evaluate_member(*a),
                           (candidates, member_keys), batch_size=chunk)
    return jax.vmap(_margin, in_axes=(0, None))(logits, labels)

  def cond(state):
    step, _, done, _ = state
    return jnp.logical_and(step < max_iters, jnp.logical_not(jnp.all(done)))

  def body(state):
    step, mean, done, loop_key = state
    loop_key, check_key, sample_key, pop_key = jax.random.split(loop_key, 4)
    logits = apply_fn(variables, to_image(mean), check_key)
    done = jnp.logical_or(done, jnp.argmax(logits, axis=-1) != labels)

    noise = common.normal(sample_key, (population,) + images.shape)
    margins = population_margins(mean + sigma * noise, pop_key)
    reward = -0.5 * jnp.clip(margins, 0.0, 1000.0)
    advantage = (reward - jnp.mean(reward, axis=0)) / (
        jnp.std(reward, axis=0) + 1e-7)
    direction = jnp.einsum("pb,pb...->b...", advantage, noise)
    update = (learning_rate / (population * sigma)) * direction
    keep = done.reshape((-1,) + (1,) * (images.ndim - 1))
    mean = jnp.where(keep, mean, mean + update)
    return step + 1, mean, done, loop_key

  init_key, loop_key = jax.random.split(key)
  init_mean = 0.001 * common.normal(init_key, images.shape)
  init_done = jnp.zeros(images.shape[:1], jnp.bool_)
  _, mean, _, _ = jax.lax.while_loop(
      cond, body, (jnp.asarray(0, jnp.int32), init_mean, init_done, loop_key))
  return to_image(mean)
