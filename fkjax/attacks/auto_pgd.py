"""Auto-PGD in l_inf (Croce & Hein, ICML 2020): APGD-CE, APGD-DLR, APGD-T.

APGD is PGD with momentum whose step size needs no tuning: it starts at
``2 * epsilon`` and is halved at fixed checkpoints whenever the attack stops
making progress, restarting from the best point found so far.

Written from the paper. With iterates ``x^(0), x^(1), ...`` (``x^(0)`` a
random point of the ball) and loss ``f``:

* step: ``z = P(x^(k) + eta * sign(grad f(x^(k))))``, then
  ``x^(k+1) = P(x^(k) + a (z - x^(k)) + (1 - a)(x^(k) - x^(k-1)))`` with
  momentum ``a = 0.75`` (``a = 1`` for the first step, which has no
  previous iterate), ``P`` the projection onto the ball and [0, 1];
* checkpoints ``w_j = ceil(p_j N)`` for ``N`` iterations, ``p_0 = 0``,
  ``p_1 = 0.22``, ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``
  (``checkpoints(100) == (0, 22, 41, 57, 70, 80, 87, 93, 99)``);
* once iterate ``x^(w_j)`` and its loss are known (j >= 1), ``eta`` is halved
  if either

  1. fewer than ``rho * (w_j - w_{j-1})`` of the steps since the previous
     checkpoint increased the loss (``f(x^(i+1)) > f(x^(i))`` for
     ``w_{j-1} <= i < w_j``; ``rho = 0.75``), or
  2. ``eta`` was not halved at ``w_{j-1}`` and the best loss ``f_max`` has not
     grown since ``w_{j-1}``;

  and when it is halved the search restarts from the best point
  ``x_max``: ``x^(w_j) <- x_max`` (with its loss and gradient; the momentum
  term restarts at zero).

Each image has its own step size, counters and best point (arrays, not
Python state), so a batch is attacked at once; the loop is a
``lax.fori_loop`` with a static iteration count. Like AutoAttack, an image
counts as broken if ANY iterate fooled the model: the attack returns, per
image, the highest-loss iterate that fooled the model, else the highest-loss
iterate ``x_max``. With ``n_restarts > 1`` (and for every target of APGD-T)
the attack runs again from a new random start, and keeps, per image, the
higher-loss point of those that did not fool. Every run attacks only the
images not fooled yet: not by an earlier run, and not when clean (an image
the model misclassifies clean is returned as it is). This is AutoAttack's
and torchattacks' active set: the images are gathered into a batch of one
of ``bucket_sizes``, a ``lax.switch`` over those sizes inside the
``lax.scan`` over the runs, so that one program serves every count. Image
``i``'s random start in run ``r`` is drawn from ``fold_in(start key of r,
i)``, so it is the same whichever images the run attacks;
``compact=False`` attacks every image in every run, and fools the same
images.

Noisy models: every gradient, and the loss that steers the step size, is an
average over ``eot_samples`` noise draws (``eot.loss_and_gradient``); an
iterate counts as fooling only if it fools the model on ``check_draws``
fresh draws (``eot.fooled``), never the draws its gradient used. By default
a noisy model gets 1 such draw and a deterministic one none (its gradient
pass's logits are exact). The model's noise is drawn per batch (one key per
call of ``apply_fn``), so on a noisy model a run attacking fewer images
draws different noise than one attacking all.

With ``return_info=True`` :func:`apgd` also returns a dict with, per image,
``"fooled"`` (bool ``[batch]``: the clean image or some iterate fooled the
``check_draws`` check), ``"score"`` (the returned point's loss; ``-inf``
for an image returned clean, set aside as misclassified), per run
(``[runs, ...]``) ``"attacked"`` (bool ``[runs, batch]``: the images the run
attacked), the trace ``"loss"`` (``[runs, N + 1, batch]``: ``f(x^(k))`` as
evaluated, before any restart from ``x_max``) and ``"step_size"`` (``[runs,
N, batch]``: the step that produced ``x^(k+1)``), zero for the images a run
did not attack,
and the counts ``"image_runs"`` (the images attacked, summed over the runs)
and ``"padded_image_runs"`` (the same with the padding of the buckets).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fkjax.attacks import common
from fkjax.attacks import eot

APGD_LOSSES = ("ce", "dlr", "dlr_targeted", "cw")


def checkpoints(num_iters: int) -> tuple[int, ...]:
  """The checkpoint iterations ``w_0 = 0 < w_1 < ... <= num_iters``.

  ``p_j`` are computed in exact hundredths so that e.g. ``0.22 * 100`` is 22,
  not 23 (``ceil`` of a float rounding error).
  """
  if num_iters < 1:
    raise ValueError(f"num_iters must be >= 1, got {num_iters}.")
  hundredths = [0, 22]
  while True:
    nxt = hundredths[-1] + max(hundredths[-1] - hundredths[-2] - 3, 6)
    if nxt > 100:
      break
    hundredths.append(nxt)
  points = []
  for p in hundredths:
    w = -(-p * num_iters // 100)  # ceil in integers
    if w <= num_iters and (not points or w > points[-1]):
      points.append(w)
  return tuple(points)


def _schedule_tables(num_iters: int) -> tuple[np.ndarray, np.ndarray]:
  """Per iterate index ``i`` in [0, N]: is it a checkpoint, its window."""
  is_check = np.zeros(num_iters + 1, bool)
  window = np.zeros(num_iters + 1, np.int32)
  points = checkpoints(num_iters)
  for previous, w in zip(points[:-1], points[1:]):
    is_check[w] = True
    window[w] = w - previous
  return is_check, window


def halving_decision(increases: jax.Array, window: jax.Array | int,
                     halved_last: jax.Array, loss_max: jax.Array,
                     loss_max_last: jax.Array,
                     rho: float = 0.75) -> jax.Array:
  """Whether to halve the step at a checkpoint ``w_j``, per image.

  Args:
    increases: int, steps since ``w_{j-1}`` that increased the loss.
    window: ``w_j - w_{j-1}``.
    halved_last: bool, whether the step was halved at ``w_{j-1}``.
    loss_max: best loss so far, at ``w_j``.
    loss_max_last: best loss at ``w_{j-1}``.
    rho: condition 1's fraction.

  Returns:
    bool: condition 1 (``increases < rho * window``) or condition 2 (not
    halved at ``w_{j-1}`` and ``loss_max`` not above ``loss_max_last``).
  """
  few_increases = increases < rho * window
  stalled = jnp.logical_and(jnp.logical_not(halved_last),
                            loss_max <= loss_max_last)
  return jnp.logical_or(few_increases, stalled)


def _per_image(mask: jax.Array, ndim: int) -> jax.Array:
  return mask.reshape((-1,) + (1,) * (ndim - 1))


def _start(key: jax.Array, image_ids: jax.Array, images: jax.Array,
           epsilon: float) -> jax.Array:
  """The random start: image ``i``'s noise drawn from ``fold_in(key, i)``,
  so that an image gets the same start in any subset of its batch."""
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, image_ids)
  noise = jax.vmap(lambda k: common.uniform(k, images.shape[1:], -epsilon,
                                            epsilon))(keys)
  return common.project(images + noise, images, epsilon)


def _evaluate(x, k, *, apply_fn, variables, labels, targets, loop_key, noisy,
              loss, eot_samples, check_draws):
  """Iterate ``k``'s loss, gradient and whether it fooled the check."""
  step_key, check_key = jax.random.split(jax.random.fold_in(loop_key, k))
  value, grad, logits = eot.loss_and_gradient(
      apply_fn, variables, x, labels, step_key, loss=loss,
      eot_samples=eot_samples, targets=targets)
  if check_draws is None:
    wrong = jax.lax.cond(
        noisy,
        lambda: eot.fooled(apply_fn, variables, x, labels, check_key, 1),
        lambda: common.misclassified(logits, labels))
  else:
    wrong = eot.fooled(apply_fn, variables, x, labels, check_key,
                       check_draws, logits)
  return value, grad, wrong


def _initial_state(x0, loss0, grad0, wrong0, batch, first_step, num_iters,
                   trace):
  """The loop state at iterate 0 (with the traces if ``trace``)."""
  state = {
      "x": x0, "x_prev": x0, "grad": grad0, "loss": loss0,
      "eta": jnp.full(batch, first_step, jnp.float32),
      "x_max": x0, "grad_max": grad0, "loss_max": loss0,
      "adv": x0, "adv_loss": jnp.where(wrong0, loss0, -jnp.inf),
      "fooled": wrong0,
      "increases": jnp.zeros(batch, jnp.int32),
      "loss_max_last": loss0,
      "halved_last": jnp.zeros(batch, jnp.bool_),
  }
  if trace:
    state["trace_loss"] = jnp.zeros((num_iters + 1,) + batch,
                                    jnp.float32).at[0].set(loss0)
    state["trace_eta"] = jnp.zeros((num_iters,) + batch, jnp.float32)
  return state


def _checkpoint(s, check, window, rho, ndim):
  """The checkpoint decision once iterate k + 1 is known (in place)."""
  halve = jnp.logical_and(check, halving_decision(
      s["increases"], window, s["halved_last"], s["loss_max"],
      s["loss_max_last"], rho))
  halve_x = _per_image(halve, ndim)
  s["eta"] = jnp.where(halve, 0.5 * s["eta"], s["eta"])
  s["x"] = jnp.where(halve_x, s["x_max"], s["x"])
  s["x_prev"] = jnp.where(halve_x, s["x_max"], s["x_prev"])
  s["grad"] = jnp.where(halve_x, s["grad_max"], s["grad"])
  s["loss"] = jnp.where(halve, s["loss_max"], s["loss"])
  s["increases"] = jnp.where(check, 0, s["increases"])
  s["loss_max_last"] = jnp.where(check, s["loss_max"], s["loss_max_last"])
  s["halved_last"] = jnp.where(check, halve, s["halved_last"])


def _step(k, s, *, images, evaluate, is_check, window, epsilon, momentum,
          rho, trace):
  """The ``lax.fori_loop`` body: iterate ``k + 1`` from iterate ``k``."""
  ndim = images.ndim
  s = dict(s)
  eta = _per_image(s["eta"], ndim)
  x, x_prev = s["x"], s["x_prev"]
  z = common.project(x + eta * jnp.sign(s["grad"]), images, epsilon)
  a = jnp.where(k == 0, 1.0, momentum)
  x_new = common.project(x + a * (z - x) + (1.0 - a) * (x - x_prev), images,
                         epsilon)
  loss_new, grad_new, wrong = evaluate(x_new, k + 1)
  if trace:
    s["trace_eta"] = s["trace_eta"].at[k].set(s["eta"])
    s["trace_loss"] = s["trace_loss"].at[k + 1].set(loss_new)

  better_adv = jnp.logical_and(wrong, loss_new > s["adv_loss"])
  s["adv"] = jnp.where(_per_image(better_adv, ndim), x_new, s["adv"])
  s["adv_loss"] = jnp.where(better_adv, loss_new, s["adv_loss"])
  s["fooled"] = jnp.logical_or(s["fooled"], wrong)

  s["increases"] = s["increases"] + (loss_new > s["loss"]).astype(jnp.int32)
  improved = loss_new > s["loss_max"]
  improved_x = _per_image(improved, ndim)
  s["x_max"] = jnp.where(improved_x, x_new, s["x_max"])
  s["grad_max"] = jnp.where(improved_x, grad_new, s["grad_max"])
  s["loss_max"] = jnp.where(improved, loss_new, s["loss_max"])
  s["x_prev"], s["x"], s["grad"], s["loss"] = x, x_new, grad_new, loss_new
  _checkpoint(s, is_check[k + 1], window[k + 1], rho, ndim)
  return s


def _run(apply_fn, variables, images, labels, targets, image_ids, key,
         noisy, *, epsilon, num_iters, loss, eot_samples, check_draws,
         random_start, rho, momentum, initial_step, trace):
  """One APGD run from one random start. Returns the result and a trace.

  ``image_ids`` (int ``[batch]``) name the images for their random starts;
  ``check_draws=None`` checks on one fresh draw where ``noisy`` (a traced
  bool) and on the gradient pass's logits otherwise.
  """
  start_key, loop_key = jax.random.split(key)
  ndim = images.ndim
  x0 = images
  if random_start:
    x0 = _start(start_key, image_ids, images, epsilon)
  evaluate = functools.partial(
      _evaluate, apply_fn=apply_fn, variables=variables, labels=labels,
      targets=targets, loop_key=loop_key, noisy=noisy, loss=loss,
      eot_samples=eot_samples, check_draws=check_draws)
  loss0, grad0, wrong0 = evaluate(x0, 0)
  is_check, window = (jnp.asarray(t) for t in _schedule_tables(num_iters))
  state = _initial_state(x0, loss0, grad0, wrong0, labels.shape,
                         initial_step * epsilon, num_iters, trace)
  body = functools.partial(
      _step, images=images, evaluate=evaluate, is_check=is_check,
      window=window, epsilon=epsilon, momentum=momentum, rho=rho, trace=trace)
  state = jax.lax.fori_loop(0, num_iters, body, state)
  fooled = state["fooled"]
  x_adv = jnp.where(_per_image(fooled, ndim), state["adv"], state["x_max"])
  score = jnp.where(fooled, state["adv_loss"], state["loss_max"])
  info = {}
  if trace:
    info = {"loss": state["trace_loss"], "step_size": state["trace_eta"]}
  return x_adv, fooled, score, info


def attack_targets(apply_fn: common.ApplyFn, variables: Any,
                   images: jax.Array, labels: jax.Array, key: jax.Array,
                   num_targets: int, eot_samples: int = 1) -> jax.Array:
  """Int ``[num_targets, batch]``: APGD-T's target classes.

  The classes with the highest clean logits other than the true label, best
  first (AutoAttack's choice); for a noisy model the logits are averaged
  over ``eot_samples`` draws.
  """
  if eot_samples == 1:
    logits = apply_fn(variables, images, key).astype(jnp.float32)
  else:
    logits = jnp.mean(jax.vmap(lambda k: apply_fn(variables, images, k).astype(
        jnp.float32))(jax.random.split(key, eot_samples)), axis=0)
  num_classes = logits.shape[-1]
  if not 1 <= num_targets <= num_classes - 1:
    raise ValueError(f"num_targets must be in [1, {num_classes - 1}], got "
                     f"{num_targets}")
  true_mask = jax.nn.one_hot(labels, num_classes, dtype=jnp.bool_)
  scores = jnp.where(true_mask, -jnp.inf, logits)
  return jax.lax.top_k(scores, num_targets)[1].T


# Sizes of the batches a run attacks (the images not yet fooled, padded up):
# the batch and 3/4, 1/2, 1/4, ... of it, at most this many. Each size is one
# more copy of a run in the compiled program.
MAX_BUCKETS = 5


def bucket_sizes(batch: int, max_buckets: int = MAX_BUCKETS
                 ) -> tuple[int, ...]:
  """Ascending sizes a run's images are padded to: ``batch``, then
  ``ceil(3/4 batch)``, ``ceil(1/2 batch)``, ``ceil(1/4 batch)``, ... (each
  smaller than the one before), at most ``max_buckets`` of them
  (``bucket_sizes(500) == (63, 125, 250, 375, 500)``).

  The 3/4 step is there for a first run: a robust CIFAR model misclassifies
  a quarter to a half of its clean images, which a batch of powers of two
  would pad back to the whole batch.
  """
  ceil = lambda numerator, denominator: -(-numerator // denominator)
  candidates = [ceil(3 * batch, 4)] + [
      ceil(batch, 2 ** k) for k in range(1, batch.bit_length() + 1)]
  sizes = [batch]
  for size in candidates:
    if len(sizes) < max_buckets and size < sizes[-1]:
      sizes.append(size)
  return tuple(sorted(sizes))


def is_noisy(apply_fn: common.ApplyFn, variables: Any, images: jax.Array,
             key: jax.Array) -> jax.Array:
  """Bool scalar: whether two noise keys give different logits on
  ``images`` (a model that ignores its key gives identical ones)."""
  first, second = jax.random.split(key)
  return jnp.any(apply_fn(variables, images, first)
                 != apply_fn(variables, images, second))


def _noise_check(apply_fn, variables, images, key, check_draws, stochastic):
  """``check_draws`` as said or as ``stochastic`` implies, and a traced
  bool: whether the model draws noise, where that is left to find out."""
  if check_draws is None and stochastic is not None:
    check_draws = 1 if stochastic else 0
  noisy = (is_noisy(apply_fn, variables, images, jax.random.fold_in(key, 1))
           if check_draws is None else jnp.bool_(False))
  return check_draws, noisy


def _misclassified_clean(apply_fn, variables, images, labels, key,
                         check_draws):
  """Bool ``[batch]``: the clean images that pass an iterate's check
  (``check_draws=0`` judges one draw's logits: here one forward pass)."""
  return eot.fooled(apply_fn, variables, images, labels,
                    jax.random.fold_in(key, 2), check_draws or 1)


def _run_targets(apply_fn, variables, images, labels, key, targeted,
                 n_restarts, num_targets, eot_samples):
  """Int ``[runs, batch]``: each run's targets (zeros when untargeted)."""
  if targeted:
    targets = attack_targets(apply_fn, variables, images, labels, key,
                             num_targets, eot_samples)
    return jnp.repeat(targets, n_restarts, axis=0)
  return jnp.zeros((n_restarts,) + labels.shape, jnp.int32)


def _merge(best, new, ndim):
  """Per image, the better of ``best`` and a run's ``new`` result."""
  best_x, best_fooled, best_score = best
  new_x, new_fooled, new_score, attacked = new
  take = jnp.logical_and(attacked, jnp.logical_or(
      jnp.logical_and(new_fooled, jnp.logical_not(best_fooled)),
      jnp.logical_and(new_fooled == best_fooled, new_score > best_score)))
  return (jnp.where(_per_image(take, ndim), new_x, best_x),
          jnp.logical_or(best_fooled, new_fooled),
          jnp.where(take, new_score, best_score))


def _merge_run(best, result, ndim):
  """``best`` merged with a run's result, and the run's scan outputs."""
  new, info, padded = result
  return _merge(best, new, ndim), (new[3], info, padded)


def _attack_rows(run, images, labels, targeted, size, rows, valid, target,
                 run_key):
  """One run on the images ``rows`` (``size`` of them, the ``valid`` ones
  real), its results scattered back to the batch."""
  batch = labels.shape[0]
  x, fooled, score, info = run(images[rows], labels[rows],
                               target[rows] if targeted else None, rows,
                               run_key)
  # Padding rows go out of range, and out-of-range writes are dropped.
  to = jnp.where(valid, rows, batch)
  put = lambda full, part: full.at[to].set(part, mode="drop")
  out = (put(images, x), put(jnp.zeros(batch, jnp.bool_), fooled),
         put(jnp.full(batch, -jnp.inf, jnp.float32), score),
         put(jnp.zeros(batch, jnp.bool_), jnp.ones(size, jnp.bool_)))
  info = {name: jnp.zeros(trace.shape[:-1] + (batch,), trace.dtype).at[
      ..., to].set(trace, mode="drop") for name, trace in info.items()}
  return out, info, jnp.int32(size)


def _on_bucket(size, active, count, best, target, run_key, attack, ndim):
  """A run on the ``count`` ``active`` images, gathered into ``size``."""
  rows = jnp.nonzero(active, size=size, fill_value=0)[0]
  valid = jnp.arange(size) < count
  return _merge_run(best, attack(size, jnp.where(valid, rows, rows[0]),
                                 valid, target, run_key), ndim)


def _skip(best, branch):
  """No image left to attack: ``best`` and zero outputs like ``branch``'s."""
  shapes = jax.eval_shape(branch)
  return best, jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes[1])


def _one_run(best, inputs, *, attack, attack_all, sizes, ndim, compact):
  """The ``lax.scan`` body: one run (target, key) merged into ``best``."""
  target, run_key = inputs
  if not compact:
    return _merge_run(best, attack_all(target, run_key), ndim)
  active = jnp.logical_not(best[1])
  count = jnp.sum(active)
  buckets = [functools.partial(_on_bucket, size, active, count, best, target,
                               run_key, attack, ndim) for size in sizes]
  index = jnp.where(count == 0, 0,
                    1 + jnp.searchsorted(jnp.asarray(sizes), count))
  return jax.lax.switch(index,
                        [functools.partial(_skip, best, buckets[0])] + buckets)


def _all_runs(run, images, labels, targeted, run_targets, run_keys, compact,
              set_aside):
  """Every run, merged: the best ``(x, fooled, score)`` and, stacked over
  the runs, ``(attacked, trace info, padded size)``.

  ``set_aside`` (bool ``[batch]`` or None) marks the images counted as
  fooled before any run (misclassified when clean); with ``compact`` no run
  attacks them.
  """
  batch = labels.shape[0]
  ndim = images.ndim
  attack = functools.partial(_attack_rows, run, images, labels, targeted)
  attack_all = functools.partial(attack, batch, jnp.arange(batch),
                                 jnp.ones(batch, jnp.bool_))
  fooled = jnp.zeros(batch, jnp.bool_) if set_aside is None else set_aside
  start = (images, fooled, jnp.full(batch, -jnp.inf, jnp.float32))
  one_run = functools.partial(_one_run, attack=attack, attack_all=attack_all,
                              sizes=bucket_sizes(batch), ndim=ndim,
                              compact=compact)
  if run_targets.shape[0] == 1:
    # A lone run needs the buckets only to leave out the images set aside.
    best, outputs = one_run(start, (run_targets[0], run_keys[0]),
                            compact=compact and set_aside is not None)
    return best, jax.tree.map(lambda a: a[None], outputs)
  return jax.lax.scan(one_run, start, (run_targets, run_keys))


def apgd(apply_fn: common.ApplyFn, variables: Any, images: jax.Array,
         labels: jax.Array, key: jax.Array, *, epsilon: float = 8 / 255,
         num_iters: int = 100, loss: str = "ce", n_restarts: int = 1,
         num_targets: int = 9, eot_samples: int = 1,
         check_draws: int | None = None, stochastic: bool | None = None,
         random_start: bool = True, rho: float = 0.75, momentum: float = 0.75,
         initial_step: float = 2.0, compact: bool = True,
         skip_misclassified: bool = True, return_info: bool = False):
  """Auto-PGD in l_inf; see the module docstring for the algorithm.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    images: float array ``[batch, ...]`` with values in [0, 1].
    labels: int array ``[batch]``, the true labels.
    key: PRNG key for the random starts and the model noise.
    epsilon: l_inf radius.
    num_iters: iterations ``N`` per run (static); each costs one
      gradient (times ``eot_samples``) and ``check_draws`` forward passes.
    loss: ``"ce"`` (APGD-CE), ``"dlr"`` (APGD-DLR, >= 3 classes),
      ``"dlr_targeted"`` (APGD-T, >= 4 classes) or ``"cw"``. Static.
    n_restarts: random restarts per run (per target for APGD-T). Static.
    num_targets: APGD-T's targets: the classes with the highest clean
      logits other than the label (9 = every other class of CIFAR-10).
      Static; ignored by the untargeted losses.
    eot_samples: noise draws each gradient and loss average over. Static.
    check_draws: fresh noise draws an iterate must fool, all of them, to
      count as a success; 0 judges the gradient's first draw instead (free,
      exact for a deterministic model only). None (the default): 1 for a
      stochastic model, 0 for a deterministic one (see ``stochastic``).
      Static.
    stochastic: whether the model draws noise, for ``check_draws=None``.
      None (the default): found out at run time, by comparing the model's
      logits on ``images`` under two noise keys (two forward passes); every
      iteration then runs only the check that applies. Static.
    random_start: start from a uniform point of the ball (as the paper);
      False starts at ``images``. Static.
    rho: condition 1's fraction of successful steps. Static.
    momentum: ``a`` of the step (0.75). Static.
    initial_step: the first step size in units of ``epsilon`` (2). Static.
    compact: each run attacks only the images not fooled yet, padded to
      one of ``bucket_sizes(batch)`` (the module docstring); False attacks
      every image in every run and fools the same images. Static.
    skip_misclassified: count an image the model misclassifies clean (by
      an iterate's check, at least one draw) as fooled before the first run
      and return it unchanged. With ``compact`` a lone run (APGD-CE, -DLR)
      then compiles once per bucket size; False compiles one copy. Static.
    return_info: also return the info dict (module docstring). Static.

  Returns:
    Adversarial images like ``images`` (and the info dict if asked).
  """
  if loss not in APGD_LOSSES:
    raise ValueError(f"loss must be one of {APGD_LOSSES}, got {loss!r}")
  if n_restarts < 1:
    raise ValueError(f"n_restarts must be >= 1, got {n_restarts}.")
  targeted = loss == "dlr_targeted"
  target_key, runs_key = jax.random.split(key)
  run_targets = _run_targets(apply_fn, variables, images, labels, target_key,
                             targeted, n_restarts, num_targets, eot_samples)
  check_draws, noisy = _noise_check(apply_fn, variables, images, key,
                                    check_draws, stochastic)
  run = functools.partial(
      _run, apply_fn, variables, noisy=noisy, epsilon=epsilon,
      num_iters=num_iters, loss=loss, eot_samples=eot_samples,
      check_draws=check_draws, random_start=random_start, rho=rho,
      momentum=momentum, initial_step=initial_step, trace=return_info)
  set_aside = (_misclassified_clean(apply_fn, variables, images, labels, key,
                                    check_draws)
               if skip_misclassified else None)
  best, (attacked, infos, padded) = _all_runs(
      run, images, labels, targeted, run_targets,
      jax.random.split(runs_key, run_targets.shape[0]), compact, set_aside)
  x_adv, fooled, score = best
  if not return_info:
    return x_adv
  return x_adv, {"fooled": fooled, "score": score, "attacked": attacked,
                 "image_runs": jnp.sum(attacked),
                 "padded_image_runs": jnp.sum(padded), **infos}


def apgd_ce(apply_fn, variables, images, labels, key, **kwargs):
  """APGD on the cross-entropy; see :func:`apgd`."""
  return apgd(apply_fn, variables, images, labels, key, loss="ce", **kwargs)


def apgd_dlr(apply_fn, variables, images, labels, key, **kwargs):
  """APGD on the DLR loss; see :func:`apgd`."""
  return apgd(apply_fn, variables, images, labels, key, loss="dlr", **kwargs)


def apgd_t(apply_fn, variables, images, labels, key, **kwargs):
  """APGD-T: targeted DLR over the top ``num_targets`` classes; see
  :func:`apgd`."""
  return apgd(apply_fn, variables, images, labels, key, loss="dlr_targeted",
              **kwargs)

