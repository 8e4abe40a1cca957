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

Memory: one iteration draws ``population * batch`` perturbations and
evaluates as many images (``chunk * batch`` with ``chunk``); with
``image_chunk`` the batch is attacked that many images at a time, so both
scale with ``image_chunk`` instead of ``batch``. Each image's search is its
own, so chunking images changes only which random numbers it draws.

The search, for one batch: ``nattack`` checks its arguments and splits the
batch into groups (``image_chunk``); :func:`_search` draws ``mu_0`` and runs
a ``lax.while_loop`` of :func:`_paper_iteration` or
:func:`_attackbox_iteration`. Both sample the population around ``mu``
(:func:`_sample_population`, which scores it with
:func:`_population_margins`) and move ``mu`` by :func:`_nes_step`; they
differ in when an image counts as broken.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fkjax.attacks import common
from fkjax.attacks import eot
from fkjax.attacks import population_chunk

VARIANTS = ("paper", "attackbox")
# arctanh(+-1) is infinite; shrinking [-1, 1] slightly keeps pixels at 0 or 1
# finite, as the reference implementation does.
_TANH_SHRINK = 1.0 - 1e-6


class _Batch(NamedTuple):
  """The attacked model and batch, with the batch in tanh space."""
  apply_fn: common.ApplyFn
  variables: Any
  images: jax.Array
  labels: jax.Array
  tanh_images: jax.Array
  epsilon: float


class _Settings(NamedTuple):
  """The search's static settings (as :func:`nattack` takes them)."""
  population: int
  sigma: float
  learning_rate: float
  max_iters: int
  chunk: int | None
  success_draws: int


class _State(NamedTuple):
  """The ``lax.while_loop``'s carry.

  ``mean``: each image's ``mu``; ``done``: images broken (their ``mu``
  frozen); ``found``: the attackbox variant's breaking sample per image.
  """
  step: jax.Array
  mean: jax.Array
  done: jax.Array
  found: jax.Array
  key: jax.Array


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
  their updates are discarded. Memory: see the module docstring.

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
      memory holds (:func:`fkjax.attacks.nattack_auto_chunk`). The result
      is the same whatever the chunk. Static.
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
  if image_chunk is not None and images.shape[0] > image_chunk:
    # Each group sizes its own "auto" chunk.
    attack_group = functools.partial(
        nattack, apply_fn, variables, epsilon=epsilon, population=population,
        sigma=sigma, learning_rate=learning_rate, max_iters=max_iters,
        chunk=chunk, variant=variant, success_draws=success_draws)
    return _in_groups(attack_group, image_chunk, images, labels, key)
  if chunk in ("auto", 0):
    chunk = population_chunk.auto_chunk(apply_fn, variables, images, key,
                                        population)
  batch = _Batch(apply_fn, variables, images, labels, _to_tanh(images),
                 epsilon)
  settings = _Settings(population, sigma, learning_rate, max_iters, chunk,
                       success_draws)
  return _search(batch, settings, variant, key)


def _in_groups(attack: Any, size: int, images: jax.Array, labels: jax.Array,
               key: jax.Array) -> jax.Array:
  """``attack(images, labels, key)`` on ``size`` images at a time.

  A ``lax.map`` over the groups, each with its own key; the last group is
  padded with copies of the first image, whose results are dropped.
  """
  num_images = images.shape[0]
  pad = -num_images % size
  grouped = [jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]).reshape(
      (-1, size) + x.shape[1:]) for x in (images, labels)]
  keys = jax.random.split(key, grouped[0].shape[0])
  adversarial = jax.lax.map(lambda a: attack(*a), (*grouped, keys))
  return adversarial.reshape((-1,) + images.shape[1:])[:num_images]


def _to_tanh(images: jax.Array) -> jax.Array:
  """``arctanh(2x - 1)``, the images' point in tanh space (float32)."""
  images_f32 = images.astype(jnp.float32)
  return jnp.arctanh((2.0 * images_f32 - 1.0) * _TANH_SHRINK)


def _to_image(batch: _Batch, perturbation: jax.Array) -> jax.Array:
  """The candidate ``x'``: the perturbed tanh-space point back in pixels,
  projected onto the epsilon ball (``perturbation`` may carry leading
  population axes)."""
  candidate = (jnp.tanh(batch.tanh_images + perturbation) + 1.0) / 2.0
  return common.project(candidate, batch.images, batch.epsilon)


def _per_image(flags: jax.Array, like: jax.Array) -> jax.Array:
  """``[batch]`` flags shaped to broadcast against ``like`` ``[batch, ...]``."""
  return flags.reshape((-1,) + (1,) * (like.ndim - 1))


def _margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``z_y - max_{j != y} z_j``: positive while the example is classified right.

  Equal to ``log p_y - max_{j != y} log p_j``, the reference code's score.
  """
  return -common.cw_margin(logits, labels)


def _population_margins(batch: _Batch, settings: _Settings,
                        samples: jax.Array, key: jax.Array) -> jax.Array:
  """Margins ``[population, batch]`` of the candidates of ``samples``
  ``[population, batch, ...]``, each member on its own model noise."""
  candidates = _to_image(batch, samples)
  member_keys = jax.random.split(key, settings.population)
  evaluate = functools.partial(batch.apply_fn, batch.variables)
  if settings.chunk is None:
    logits = jax.vmap(evaluate)(candidates, member_keys)
  else:
    logits = jax.lax.map(lambda a: evaluate(*a), (candidates, member_keys),
                         batch_size=settings.chunk)
  return jax.vmap(_margin, in_axes=(0, None))(logits, batch.labels)


def _sample_population(batch: _Batch, settings: _Settings, mean: jax.Array,
                       sample_key: jax.Array, model_key: jax.Array
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The population around ``mean``: its noise, samples and margins."""
  noise = common.normal(sample_key, (settings.population,) + mean.shape)
  samples = mean + settings.sigma * noise
  return noise, samples, _population_margins(batch, settings, samples,
                                             model_key)


def _nes_step(settings: _Settings, mean: jax.Array, noise: jax.Array,
              margins: jax.Array, done: jax.Array) -> jax.Array:
  """``mean`` moved along the reward-weighted noise; done images stay."""
  reward = -0.5 * jnp.clip(margins, 0.0, 1000.0)
  advantage = (reward - jnp.mean(reward, axis=0)) / (
      jnp.std(reward, axis=0) + 1e-7)
  direction = jnp.einsum("pb,pb...->b...", advantage, noise)
  update = (settings.learning_rate /
            (settings.population * settings.sigma)) * direction
  return jnp.where(_per_image(done, mean), mean, mean + update)


def _fooled(batch: _Batch, perturbation: jax.Array, key: jax.Array,
            draws: int) -> jax.Array:
  """Whether the candidate of ``perturbation`` fools the model on ``draws``
  fresh noise draws, per image."""
  return eot.fooled(batch.apply_fn, batch.variables,
                    _to_image(batch, perturbation), batch.labels, key, draws)


def _paper_iteration(batch: _Batch, settings: _Settings,
                     state: _State) -> _State:
  """One iteration of the paper's variant: an image whose mean candidate
  fools the model is done before the population moves ``mu``."""
  loop_key, check_key, sample_key, model_key = jax.random.split(state.key, 4)
  done = jnp.logical_or(state.done, _fooled(batch, state.mean, check_key,
                                            settings.success_draws))
  noise, _, margins = _sample_population(batch, settings, state.mean,
                                         sample_key, model_key)
  mean = _nes_step(settings, state.mean, noise, margins, done)
  return _State(state.step + 1, mean, done, state.found, loop_key)


def _attackbox_iteration(batch: _Batch, settings: _Settings,
                         state: _State) -> _State:
  """One iteration of the attackbox variant: an image with a misclassified
  sample keeps its lowest-margin one (if it also fools ``success_draws -
  1`` fresh draws) and is done."""
  loop_key, check_key, sample_key, model_key = jax.random.split(state.key, 4)
  noise, samples, margins = _sample_population(batch, settings, state.mean,
                                               sample_key, model_key)
  best = jnp.argmin(margins, axis=0)
  candidate = samples[best, jnp.arange(samples.shape[1])]
  wrong = jnp.min(margins, axis=0) < 0.0
  if settings.success_draws > 1:
    wrong = jnp.logical_and(wrong, _fooled(batch, candidate, check_key,
                                           settings.success_draws - 1))
  newly = jnp.logical_and(wrong, jnp.logical_not(state.done))
  found = jnp.where(_per_image(newly, candidate), candidate, state.found)
  done = jnp.logical_or(state.done, wrong)
  mean = _nes_step(settings, state.mean, noise, margins, done)
  return _State(state.step + 1, mean, done, found, loop_key)


def _searching(max_iters: int, state: _State) -> jax.Array:
  """The loop's condition: iterations left and an image not done."""
  return jnp.logical_and(state.step < max_iters,
                         jnp.logical_not(jnp.all(state.done)))


def _search(batch: _Batch, settings: _Settings, variant: str,
            key: jax.Array) -> jax.Array:
  """NAttack on one batch: draws ``mu_0``, runs the ``lax.while_loop`` of
  the variant's iterations and returns each image's final candidate."""
  init_key, loop_key = jax.random.split(key)
  attackbox = variant == "attackbox"
  init_scale = 1.0 if attackbox else 0.001
  init_mean = init_scale * common.normal(init_key, batch.images.shape)
  init_done = jnp.zeros(batch.images.shape[:1], jnp.bool_)
  iteration = _attackbox_iteration if attackbox else _paper_iteration
  final = jax.lax.while_loop(
      functools.partial(_searching, settings.max_iters),
      functools.partial(iteration, batch, settings),
      _State(jnp.asarray(0, jnp.int32), init_mean, init_done, init_mean,
             loop_key))
  mean = final.mean
  if attackbox:
    mean = jnp.where(_per_image(final.done, mean), final.found, mean)
  return _to_image(batch, mean)
