"""NAttack (Li et al., 2019): a gradient-free, score-based l_inf attack.

For every image NAttack keeps a Gaussian search distribution ``N(mu, sigma^2)``
over perturbations in tanh space, ``x' = Proj((tanh(arctanh(2x - 1) + z) +
1) / 2)``, and moves ``mu`` with natural evolution strategies: it samples a
population of perturbations, scores each by the clipped logit margin
``max(z_y - max_{j != y} z_j, 0)`` and steps along the reward-weighted mean of
the samples. It only evaluates the model, never differentiates it, so gradient
masking does not stop it.

Two variants (``variant=``):

* ``"paper"`` (default): the NAttack paper's algorithm (Li et al., ICML 2019,
  Algorithm 1): ``mu`` starts at N(0, 0.001^2) and an image counts as broken
  when the mean candidate ``x'(mu)`` is misclassified. Population 300, sigma
  0.1, learning rate 0.02 and 500 iterations are the settings of the paper
  under evaluation. Measured stronger than the attackbox variant (50
  CIFAR-10 images of a small ResNet8, population 100, 100 iterations: 64%
  robust against 84%).
* ``"attackbox"``: the attackbox code that the Feynman-Kac paper names:
  ``mu`` starts at N(0, 1) and an image counts as broken as soon as any
  population sample is misclassified (that sample is returned). Use it with
  ``success_draws=1`` to reproduce the paper's A5 column.

On a noisy model one noise draw can misclassify an image by luck, so an
image is frozen only after its candidate fooled the model on
``success_draws`` noise draws (default 3): ``success_draws`` fresh draws of
the mean candidate (``"paper"``), or the sample's own draw plus
``success_draws - 1`` fresh ones (``"attackbox"``). On a deterministic model
every draw agrees and the extra draws only cost forward passes of the batch
(3 against the population's 300 per iteration).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
from jax.extend import core as jax_core
import jax.numpy as jnp

from fkjax.attacks import common
from fkjax.attacks import eot

VARIANTS = ("paper", "attackbox")
# chunk="auto": population members evaluated at once where the device does
# not report its memory (a CPU), and the part of a device's free memory the
# population's forward passes may take elsewhere (the rest: the attack's
# own arrays, XLA's workspace; forward_bytes of ResNet20 at batch 100 was
# 32 MiB where XLA:CPU's compiled forward pass asked 57 MiB).
CPU_CHUNK = 10
MEMORY_FRACTION = 0.25
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
            chunk: int | str | None = None,
            image_chunk: int | None = None,
            variant: str = "paper",
            success_draws: int = 3) -> jax.Array:
  """Runs NAttack on a batch; each image stops once it is misclassified.

  ``"paper"``: every iteration first classifies the current mean candidate
  of each image on ``success_draws`` fresh noise draws; an image it fools on
  all of them is marked done and its search distribution frozen (so the
  returned image is the one that fooled the model). ``"attackbox"``: after
  scoring the population, an image with a misclassified sample takes the
  sample with the lowest margin; if it also fools ``success_draws - 1`` fresh
  draws the image is done and that sample is returned. The loop, a
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
      of it in one ``vmap``; ``"auto"`` (or 0) as many as the device's
      memory holds (:func:`auto_chunk`). The result is the same whatever
      the chunk. Static.
    image_chunk: if set, images are attacked this many at a time (a
      ``lax.map`` over groups, the last one padded); ``None`` attacks the
      whole batch at once. Static.
    variant: ``"paper"`` (mu_0 ~ N(0, 0.001^2), success judged on the mean)
      or ``"attackbox"`` (mu_0 ~ N(0, 1), success if any sample is
      misclassified); see the module docstring. Static.
    success_draws: noise draws a candidate must fool before its image is
      frozen (>= 1; 1 for the attackbox code's own behaviour). Static.

  Returns:
    Adversarial images, same shape and dtype as ``images``.
  """
  if population < 2:
    raise ValueError(f"population must be >= 2, got {population}.")
  if variant not in VARIANTS:
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
  if success_draws < 1:
    raise ValueError(f"success_draws must be >= 1, got {success_draws}.")
  if chunk in ("auto", 0) and (image_chunk is None
                               or images.shape[0] <= image_chunk):
    chunk = auto_chunk(apply_fn, variables, images, key, population)
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
        chunk=chunk, variant=variant, success_draws=success_draws)
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

  batch_shape = (-1,) + (1,) * (images.ndim - 1)
  attackbox = variant == "attackbox"

  def cond(state):
    step, _, done, _, _ = state
    return jnp.logical_and(step < max_iters, jnp.logical_not(jnp.all(done)))

  def body(state):
    step, mean, done, found, loop_key = state
    loop_key, check_key, sample_key, pop_key = jax.random.split(loop_key, 4)
    if not attackbox:
      done = jnp.logical_or(done, eot.fooled(
          apply_fn, variables, to_image(mean), labels, check_key,
          success_draws))

    noise = common.normal(sample_key, (population,) + images.shape)
    samples = mean + sigma * noise
    margins = population_margins(samples, pop_key)
    if attackbox:
      best = jnp.argmin(margins, axis=0)
      candidate = samples[best, jnp.arange(images.shape[0])]
      wrong = jnp.min(margins, axis=0) < 0.0
      if success_draws > 1:
        wrong = jnp.logical_and(wrong, eot.fooled(
            apply_fn, variables, to_image(candidate), labels, check_key,
            success_draws - 1))
      newly = jnp.logical_and(wrong, jnp.logical_not(done))
      found = jnp.where(newly.reshape(batch_shape), candidate, found)
      done = jnp.logical_or(done, wrong)
    reward = -0.5 * jnp.clip(margins, 0.0, 1000.0)
    advantage = (reward - jnp.mean(reward, axis=0)) / (
        jnp.std(reward, axis=0) + 1e-7)
    direction = jnp.einsum("pb,pb...->b...", advantage, noise)
    update = (learning_rate / (population * sigma)) * direction
    keep = done.reshape(batch_shape)
    mean = jnp.where(keep, mean, mean + update)
    return step + 1, mean, done, found, loop_key

  init_key, loop_key = jax.random.split(key)
  init_scale = 1.0 if attackbox else 0.001
  init_mean = init_scale * common.normal(init_key, images.shape)
  init_done = jnp.zeros(images.shape[:1], jnp.bool_)
  _, mean, done, found, _ = jax.lax.while_loop(
      cond, body, (jnp.asarray(0, jnp.int32), init_mean, init_done, init_mean,
                   loop_key))
  if attackbox:
    mean = jnp.where(done.reshape(batch_shape), found, mean)
  return to_image(mean)


def auto_chunk(apply_fn: common.ApplyFn, variables: Any, images: jax.Array,
               key: jax.Array, population: int,
               device: jax.Device | None = None) -> int:
  """Population members to evaluate at once on ``device``'s memory.

  ``MEMORY_FRACTION`` of the device's free memory (``memory_stats()``:
  ``bytes_limit - bytes_in_use``) over one member's forward pass at this
  batch (:func:`forward_bytes`), between 1 and ``population``; where the
  device reports no memory (a CPU), ``CPU_CHUNK``.

  Args:
    apply_fn: the model, ``apply_fn(variables, images, key) -> logits``.
    variables, images, key: as :func:`nattack` takes them (arrays or
      tracers; only their shapes are used).
    population: NAttack's population.
    device: default the first local device.
  """
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except (AttributeError, NotImplementedError, RuntimeError):
    stats = None
  if not stats or not stats.get("bytes_limit"):
    return min(CPU_CHUNK, population)
  free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
  member = forward_bytes(apply_fn, variables, images, key)
  return int(min(population, max(1, free * MEMORY_FRACTION // member)))


def forward_bytes(apply_fn: common.ApplyFn, variables: Any,
                  images: jax.Array, key: jax.Array) -> int:
  """An estimate of one forward pass's memory at this batch.

  The most bytes the pass's images and intermediate values hold at once,
  each freed after its last use in the traced program's order; the
  variables, shared by every member, are not counted. XLA's buffers differ
  (it fuses, pads and keeps workspaces): :data:`MEMORY_FRACTION` leaves
  room. Traces the model; compiles nothing.
  """
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
  closed = jax.make_jaxpr(apply_fn)(*jax.tree.map(spec, (variables, images,
                                                         key)))
  return _nbytes(closed.jaxpr.invars[-2]) + _peak_bytes(closed.jaxpr)


def _nbytes(var: Any) -> int:
  aval = var.aval
  dtype = getattr(aval, "dtype", None)
  if not hasattr(aval, "shape") or dtype is None:
    return 0
  itemsize = getattr(dtype, "itemsize", 4)
  size = 1
  for d in aval.shape:
    size *= int(d)
  return size * itemsize


def _peak_bytes(jaxpr: Any) -> int:
  """Peak bytes of the values ``jaxpr`` computes, freed after last use."""
  last_use: dict[Any, int] = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jax_core.Var):
        last_use[v] = i
  for v in jaxpr.outvars:
    if isinstance(v, jax_core.Var):
      last_use[v] = len(jaxpr.eqns)
  inputs = {v for v in (*jaxpr.invars, *jaxpr.constvars)}
  live = peak = 0
  for i, eqn in enumerate(jaxpr.eqns):
    inner = max((_peak_bytes(getattr(j, "jaxpr", j))
                 for j in jax_core.jaxprs_in_params(eqn.params)), default=0)
    out = sum(_nbytes(v) for v in eqn.outvars)
    peak = max(peak, live + inner + out)
    live += sum(_nbytes(v) for v in eqn.outvars if v in last_use)
    freed = {v for v in eqn.invars if isinstance(v, jax_core.Var)
             and last_use.get(v) == i and v not in inputs}
    live -= sum(_nbytes(v) for v in freed)
  return peak
