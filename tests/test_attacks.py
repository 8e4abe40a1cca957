"""Tests for fkjax.attacks: linear optimality, constraints, EOT, NAttack."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fkjax import attacks

EPS = 8 / 255
# x +- eps is rounded to float32, so a coordinate may sit one ulp past eps.
BOUND_TOL = 1e-6


def _accuracy(apply_fn, params, images, labels):
  logits = apply_fn(params, images, jax.random.key(123))
  return float(jnp.mean(jnp.argmax(logits, -1) == labels))


# --- models -----------------------------------------------------------------


def _linear(params, images, key):
  del key
  return images.reshape(images.shape[0], -1) @ params["w"] + params["b"]


def _convnet(params, images, key):
  """A tiny deterministic convnet; the key is ignored."""
  del key
  h = jax.lax.conv_general_dilated(
      images, params["conv"], (2, 2), "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h = jax.nn.relu(h + params["conv_b"])
  return jnp.mean(h, axis=(1, 2)) @ params["w"] + params["b"]


def _noisy_mlp(params, images, key):
  """An MLP with multiplicative Gaussian noise on its hidden units."""
  h = jnp.tanh(images.reshape(images.shape[0], -1) @ params["w1"])
  # A flat draw compiles faster on XLA:CPU than one shaped like h.
  noise = jax.random.normal(key, (h.size,)).reshape(h.shape)
  h = h * (1.0 + 0.5 * noise)
  return h @ params["w2"]


def _mlp(params, images, key):
  del key
  h = jnp.tanh(images.reshape(images.shape[0], -1) @ params["w1"] +
               params["b1"])
  return h @ params["w2"] + params["b2"]


@pytest.fixture(scope="module")
def random_convnet():
  rng = np.random.default_rng(0)
  params = {
      "conv": 0.5 * rng.normal(size=(3, 3, 3, 8)),
      "conv_b": np.zeros(8),
      "w": rng.normal(size=(8, 10)),
      "b": np.zeros(10),
  }
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  images = rng.uniform(size=(4, 8, 8, 3)).astype(np.float32)
  # Pixels on the box's faces must stay inside it.
  images[0, :4] = 0.0
  images[1, :4] = 1.0
  labels = rng.integers(0, 10, 4).astype(np.int32)
  return params, jnp.asarray(images), jnp.asarray(labels)


@pytest.fixture(scope="module")
def trained_mlp():
  """A 3-class tanh MLP fitted to a nonlinear rule on 4x4x3 images."""
  rng = np.random.default_rng(0)
  directions = rng.normal(size=(48, 2)).astype(np.float32)

  def sample(n, seed):
    x = np.random.default_rng(seed).uniform(0, 1, (n, 48)).astype(np.float32)
    s = (x - 0.5) @ directions
    y = (s[:, 0] * s[:, 1] > 0).astype(np.int32) + (np.abs(s[:, 0]) > 1.5)
    return jnp.asarray(x.reshape(n, 4, 4, 3)), jnp.asarray(y, jnp.int32)

  x_train, y_train = sample(1024, 1)
  x_test, y_test = sample(96, 2)
  params = {
      "w1": rng.normal(size=(48, 32)) / 3, "b1": np.zeros(32),
      "w2": rng.normal(size=(32, 3)) / 6, "b2": np.zeros(3),
  }
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  optimizer = optax.adam(1e-2)

  @jax.jit
  def fit(params):
    def step(carry, _):
      params, state = carry
      grads = jax.grad(lambda p: jnp.mean(
          attacks.cross_entropy(_mlp(p, x_train, None), y_train)))(params)
      updates, state = optimizer.update(grads, state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)),
                                  None, length=300)
    return params

  return fit(params), x_test, y_test


# --- linear models: FGSM is optimal ------------------------------------------


def test_fgsm_matches_closed_form_on_binary_linear_classifier():
  """FGSM moves each margin by exactly -eps * ||w_y - w_j||_1."""
  rng = np.random.default_rng(1)
  d, n = 48, 64
  w = rng.normal(size=(d, 2)).astype(np.float32)
  delta = w[:, 0] - w[:, 1]
  # Bias making the margin of the all-0.5 image zero keeps images central.
  b = np.array([-0.5 * delta.sum(), 0.0], np.float32)
  labels = rng.integers(0, 2, n)
  sign = np.where(labels == 0, 1.0, -1.0).astype(np.float32)  # w_y - w_j
  threshold = EPS * np.abs(delta).sum()
  # Margins (for the true label) on a grid in [-2, 2] * threshold avoiding
  # +-threshold, so that no example sits on the decision boundary.
  target = threshold * rng.choice(
      np.r_[np.linspace(-2, -0.1, 10), np.linspace(0.1, 0.9, 10),
            np.linspace(1.1, 2, 10)], n)
  x = rng.uniform(0.4, 0.6, (n, d)).astype(np.float32)
  current = sign * (x @ delta + b[0] - b[1])
  x = x + ((target - current) / (delta @ delta))[:, None] * (
      sign[:, None] * delta[None])
  # The box never clips, so the unconstrained closed form is exact.
  assert x.min() >= EPS and x.max() <= 1 - EPS

  params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
  images = jnp.asarray(x.reshape(n, 4, 4, 3))
  labels = jnp.asarray(labels, jnp.int32)
  x_adv = jax.jit(functools.partial(attacks.fgsm, _linear))(
      params, images, labels, jax.random.key(0))

  margins = np.asarray(_linear(params, images, None) @ jnp.array([1.0, -1.0]))
  margins_adv = np.asarray(
      _linear(params, x_adv, None) @ jnp.array([1.0, -1.0]))
  np.testing.assert_allclose(sign * margins, target, atol=1e-4)
  np.testing.assert_allclose(sign * margins_adv, target - threshold,
                             atol=1e-4)
  closed_form = np.mean(target > threshold)
  assert 0.0 < closed_form < np.mean(target > 0)  # the attack matters
  assert _accuracy(_linear, params, x_adv, labels) == pytest.approx(
      closed_form)


# --- constraints -------------------------------------------------------------

_CONSTRAINT_ATTACKS = {
    "fgsm": functools.partial(attacks.fgsm),
    "fgsm_eps": functools.partial(attacks.fgsm, epsilon=0.05),
    "pgd_unrolled": functools.partial(attacks.pgd, num_steps=3, unroll=3),
    "pgd_scan": functools.partial(attacks.pgd, num_steps=3, unroll=1,
                                  random_start=False),
    "cw_scan2": functools.partial(attacks.cw_linf, num_steps=3, unroll=2,
                                  eot_samples=2),
    "nattack": functools.partial(attacks.nattack, population=16, max_iters=4,
                                 chunk=5),
    "nattack_image_chunks": functools.partial(
        attacks.nattack, population=16, max_iters=4, image_chunk=3),
}


@pytest.mark.parametrize("name", list(_CONSTRAINT_ATTACKS))
def test_attack_respects_bound_box_dtype_and_shape(name, random_convnet):
  params, images, labels = random_convnet
  attack = _CONSTRAINT_ATTACKS[name]
  epsilon = attack.keywords.get("epsilon", EPS)
  x_adv = jax.jit(functools.partial(attack, _convnet))(
      params, images, labels, jax.random.key(1))
  assert x_adv.shape == images.shape
  assert x_adv.dtype == images.dtype
  assert float(jnp.max(jnp.abs(x_adv - images))) <= epsilon + BOUND_TOL
  assert float(jnp.min(x_adv)) >= 0.0 and float(jnp.max(x_adv)) <= 1.0
  if not name.startswith("nattack"):  # 4 NES iterations barely move them
    # The attack moved something: it is not the identity.
    assert float(jnp.max(jnp.abs(x_adv - images))) > 0.5 * epsilon


def test_loop_forms_agree(random_convnet):
  params, images, labels = random_convnet
  key = jax.random.key(2)
  run = lambda unroll: jax.jit(functools.partial(
      attacks.pgd, _convnet, num_steps=3, unroll=unroll))(
          params, images, labels, key)
  np.testing.assert_allclose(run(3), run(1), atol=1e-6)
  np.testing.assert_allclose(run(2), run(1), atol=1e-6)
  with pytest.raises(ValueError, match="unroll must be an int"):
    run(True)


def test_cw_margin_any_number_of_classes():
  logits = jnp.array([[3.0, 1.0, 2.0, -1.0, 0.5], [0.0, 4.0, 1.0, 1.0, 9.0]])
  labels = jnp.array([0, 1])
  np.testing.assert_allclose(attacks.cw_margin(logits, labels), [-1.0, 5.0])
  np.testing.assert_allclose(
      attacks.cw_margin(logits[:, :2], labels), [-2.0, -4.0])


# --- a trained model ---------------------------------------------------------


def test_attacks_never_increase_accuracy_and_pgd_beats_fgsm(trained_mlp):
  params, images, labels = trained_mlp
  key = jax.random.key(3)
  clean = _accuracy(_mlp, params, images, labels)
  run = lambda attack: _accuracy(
      _mlp, params,
      jax.jit(functools.partial(attack, _mlp))(params, images, labels, key),
      labels)
  fgsm = run(attacks.fgsm)
  pgd = run(functools.partial(attacks.pgd, num_steps=10, unroll=1))
  cw = run(functools.partial(attacks.cw_linf, num_steps=10, unroll=1))
  nattack = run(functools.partial(attacks.nattack, population=50,
                                  max_iters=30))
  assert clean > 0.5
  for robust in (fgsm, pgd, cw, nattack):
    assert robust < clean
  assert pgd <= fgsm


# --- EOT ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def noisy_mlp():
  rng = np.random.default_rng(4)
  params = {"w1": jnp.asarray(rng.normal(size=(48, 16)) / 7, jnp.float32),
            "w2": jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)}
  images = jnp.asarray(rng.uniform(size=(4, 4, 4, 3)), jnp.float32)
  return params, images, jnp.array([0, 1, 2, 0])


def _gradient_variance(apply_fn, params, images, labels, eot_samples):
  """Total variance of the EOT gradient over 64 independent outer keys."""
  keys = jax.random.split(jax.random.key(5), 64)
  grads = jax.jit(jax.vmap(lambda k: attacks.input_gradient(
      apply_fn, params, images, labels, k, eot_samples=eot_samples)))(keys)
  return float(jnp.sum(jnp.var(grads, axis=0))), jnp.mean(grads, axis=0)


def test_more_eot_samples_reduce_gradient_variance(noisy_mlp):
  params, images, labels = noisy_mlp
  var1, mean1 = _gradient_variance(_noisy_mlp, params, images, labels, 1)
  var8, mean8 = _gradient_variance(_noisy_mlp, params, images, labels, 8)
  assert var1 > 0.0
  # Averaging 8 independent draws divides the variance by 8 (ratio 0.125).
  assert 0.05 < var8 / var1 < 0.25
  # Both estimate the same expected gradient.
  scale = float(jnp.sqrt(var1 / mean1.size))
  assert float(jnp.max(jnp.abs(mean8 - mean1))) < 2.0 * scale


def test_eot_is_exact_for_deterministic_model(random_convnet):
  params, images, labels = random_convnet
  key = jax.random.key(6)
  gradient = lambda k: jax.jit(functools.partial(
      attacks.input_gradient, _convnet, eot_samples=k))(
          params, images, labels, key)
  g1, g4 = gradient(1), gradient(4)
  np.testing.assert_allclose(g1, g4, rtol=1e-5, atol=1e-7)


# --- NAttack -----------------------------------------------------------------


@pytest.fixture(scope="module")
def fragile_linear():
  """A binary linear model and images it classifies right with small margins.

  The margins are 0.8 * eps * ||w_0 - w_1||_1: an l_inf attack that finds the
  sign pattern of w_0 - w_1 fools every image, while a random corner of the
  ball moves the margin only by about eps * ||w_0 - w_1||_2 / sqrt(3).
  """
  rng = np.random.default_rng(7)
  w = rng.normal(size=(48, 2)).astype(np.float32)
  delta = w[:, 0] - w[:, 1]
  x = rng.uniform(0.3, 0.7, (8, 48)).astype(np.float32)
  target = 0.8 * EPS * np.abs(delta).sum()
  x = x + ((target - x @ delta) / (delta @ delta))[:, None] * delta[None]
  params = {"w": jnp.asarray(w), "b": jnp.zeros(2)}
  return params, jnp.asarray(x.reshape(8, 4, 4, 3)), jnp.zeros(8, jnp.int32)


def test_nattack_fools_gradient_masked_model_where_pgd_fails(fragile_linear):
  params, images, labels = fragile_linear

  def masked(params, images, key):
    # The front end hides the gradient: it is zero everywhere.
    return _linear(params, jax.lax.stop_gradient(images), key)

  key = jax.random.key(8)
  assert _accuracy(masked, params, images, labels) == 1.0
  x_pgd = jax.jit(functools.partial(attacks.pgd, masked, num_steps=20,
                                    unroll=1))(params, images, labels, key)
  x_nes = jax.jit(functools.partial(attacks.nattack, masked, max_iters=100))(
      params, images, labels, key)
  assert _accuracy(masked, params, x_pgd, labels) == 1.0
  assert _accuracy(masked, params, x_nes, labels) == 0.0
  assert float(jnp.max(jnp.abs(x_nes - images))) <= EPS + BOUND_TOL


def test_nattack_never_differentiates_the_model(fragile_linear):
  params, images, labels = fragile_linear

  @jax.custom_vjp
  def front_end(x):
    return x

  def front_end_fwd(x):
    return x, None

  def front_end_bwd(_, g):
    raise AssertionError("the model was differentiated")

  front_end.defvjp(front_end_fwd, front_end_bwd)

  def guarded(params, images, key):
    return _linear(params, front_end(images), key)

  with pytest.raises(AssertionError, match="differentiated"):
    jax.grad(lambda x: jnp.sum(guarded(params, x, None)))(images)
  x_adv = jax.jit(functools.partial(attacks.nattack, guarded, population=32,
                                    max_iters=3))(
                                        params, images, labels,
                                        jax.random.key(9))
  assert x_adv.shape == images.shape


def test_nattack_freezes_images_that_start_misclassified(fragile_linear):
  params, images, labels = fragile_linear
  wrong = 1 - labels  # every image already misclassified
  x_adv = jax.jit(functools.partial(
      attacks.nattack, _linear, population=8, max_iters=50))(
          params, images, wrong, jax.random.key(10))
  # Stopped before the first update: only the 0.001-scale initial mean moved
  # the images.
  assert float(jnp.max(jnp.abs(x_adv - images))) < 0.01


def test_nattack_image_chunks_attack_each_group_on_its_own(random_convnet):
  # Images in groups of 2 = each group attacked alone with its split key.
  params, images, labels = random_convnet
  attack = functools.partial(attacks.nattack, _convnet, population=8,
                             max_iters=3)
  key = jax.random.key(2)
  chunked = jax.jit(functools.partial(attack, image_chunk=2))(
      params, images, labels, key)
  for group, group_key in enumerate(jax.random.split(key, 2)):
    part = slice(2 * group, 2 * group + 2)
    alone = jax.jit(attack)(params, images[part], labels[part], group_key)
    np.testing.assert_allclose(chunked[part], alone, rtol=1e-6, atol=1e-6)


def test_nattack_attackbox_variant_returns_the_fooling_sample(fragile_linear):
  """Already-misclassified images stop at once; the attackbox variant then
  returns a population sample around mu_0 ~ N(0, 1), far from the image,
  where the paper's variant returns its N(0, 0.001^2) mean."""
  params, images, labels = fragile_linear
  wrong = 1 - labels
  x_adv = jax.jit(functools.partial(
      attacks.nattack, _linear, population=8, max_iters=50,
      variant="attackbox", success_draws=1))(
          params, images, wrong, jax.random.key(10))
  assert float(jnp.max(jnp.abs(x_adv - images))) > 0.5 * EPS
  assert float(jnp.max(jnp.abs(x_adv - images))) <= EPS + BOUND_TOL
  assert _accuracy(_linear, params, x_adv, wrong) == 0.0
  with pytest.raises(ValueError, match="variant"):
    attacks.nattack(_linear, params, images, labels, jax.random.key(0),
                    variant="authors")


def test_nattack_needs_several_fooling_draws_before_freezing():
  """A model that is right on average but wrong on 40% of single draws.

  With one check draw NAttack freezes (does not move) about 40% of the
  images after its first check; needing 3 fooling draws freezes about 6%.
  """
  def coin(params, images, key):
    del params
    logits = jnp.broadcast_to(jnp.array([1.0, 0.0]), (images.shape[0], 2))
    return logits + 3.0 * jax.random.normal(key, logits.shape)

  images = jnp.full((64, 4, 4, 3), 0.5)
  labels = jnp.zeros(64, jnp.int32)

  def frozen(draws):
    x_adv = jax.jit(functools.partial(
        attacks.nattack, coin, population=8, max_iters=1,
        success_draws=draws))(None, images, labels, jax.random.key(12))
    # A frozen image keeps the 0.001-scale initial mean; one NES update of
    # the others moves some pixel by more than 0.01.
    moved = jnp.max(jnp.abs(x_adv - images).reshape(64, -1), axis=1)
    return int(jnp.sum(moved < 0.005)), int(jnp.sum(moved > 0.01))

  frozen1, moved1 = frozen(1)
  frozen3, moved3 = frozen(3)
  assert frozen1 + moved1 == 64 and frozen3 + moved3 == 64
  assert 15 <= frozen1 <= 40
  assert frozen3 <= 12


# --- best-so-far PGD ---------------------------------------------------------


def _slab_model(alpha):
  """A binary model misclassifying a thin slab that sign steps cross.

  With ``u = s . (x - 0.5) / (48 alpha)`` for a sign vector ``s``, PGD steps
  of ``alpha`` on the images below move ``u`` by exactly 1 per step. The
  class-1 logit ``0.3 - |u - 1.2|`` wins only for ``|u - 1.2| < 0.3``: PGD
  from ``u = 0`` visits ``u = 1, 2, 1, 2, ...``, fooling the model at odd
  steps only.
  """
  rng = np.random.default_rng(13)
  signs = rng.choice([-1.0, 1.0], 48).astype(np.float32)
  offsets = rng.uniform(-0.1, 0.1, (8, 48)).astype(np.float32)
  offsets -= np.outer(offsets @ signs / 48, signs)  # s . offsets = 0
  images = jnp.asarray((0.5 + offsets).reshape(8, 4, 4, 3))

  def slab(params, images, key):
    del params, key
    u = (images.reshape(images.shape[0], -1) - 0.5) @ signs / (48 * alpha)
    margin = 0.3 - jnp.abs(u - 1.2)
    return jnp.stack([jnp.zeros_like(margin), margin], axis=-1)

  return slab, images, jnp.zeros(8, jnp.int32)


@pytest.mark.parametrize("unroll", [5, 1])
def test_pgd_best_so_far_returns_an_iterate_that_fooled_the_model(unroll):
  alpha = 1 / 255
  slab, images, labels = _slab_model(alpha)
  run = lambda **kw: jax.jit(functools.partial(
      attacks.pgd, slab, epsilon=2 * alpha, step_size=alpha, num_steps=4,
      random_start=False, unroll=unroll, **kw))(
          None, images, labels, jax.random.key(0))
  final = run()
  best = run(return_best=True, check_draws=0)
  best_fresh = run(return_best=True, check_draws=2)
  assert _accuracy(slab, None, images, labels) == 1.0
  assert _accuracy(slab, None, final, labels) == 1.0  # u = 2: right again
  for x_adv in (best, best_fresh):
    assert _accuracy(slab, None, x_adv, labels) == 0.0  # u = 1
    assert float(jnp.max(jnp.abs(x_adv - images))) <= 2 * alpha + BOUND_TOL


def test_pgd_final_iterate_is_the_training_attack(trained_mlp):
  """``return_best=False`` is the plain loop: start, then sign steps with
  the gradient keys ``split(split(key)[1], num_steps)``."""
  params, images, labels = trained_mlp
  key = jax.random.key(14)
  x_adv = jax.jit(functools.partial(attacks.pgd, _mlp, num_steps=4))(
      params, images, labels, key)
  start_key, steps_key = jax.random.split(key)
  x = attacks.project(images + attacks.common.uniform(
      start_key, images.shape, -EPS, EPS), images, EPS)
  for step_key in jax.random.split(steps_key, 4):
    grad = attacks.input_gradient(_mlp, params, x, labels, step_key)
    x = attacks.project(x + (2 / 255) * jnp.sign(grad), images, EPS)
  np.testing.assert_allclose(x_adv, x, atol=1e-7)
  # Best-so-far never leaves more images robust on a deterministic model.
  best = jax.jit(functools.partial(attacks.pgd, _mlp, num_steps=4,
                                   return_best=True, check_draws=0))(
                                       params, images, labels, key)
  robust = lambda x: np.asarray(jnp.argmax(_mlp(params, x, None), -1) ==
                                labels)
  assert not np.any(robust(best) & ~robust(x_adv))


def test_sweep_step_size_grows_with_epsilon():
  assert attacks.sweep_step_size(8 / 255, 20) == pytest.approx(1 / 255)
  assert attacks.sweep_step_size(64 / 255, 20) == pytest.approx(8 / 255)
  assert attacks.sweep_step_size(0.1, 10, travel=1.0) == pytest.approx(0.01)


@pytest.mark.slow
def test_cw_authors_scales_its_perturbation_instead_of_projecting():
  from tests import tiny_models  # pylint: disable=import-outside-toplevel
  params, x, y = tiny_models.trained_mlp()
  apply_fn = tiny_models.relu_mlp
  key = jax.random.key(0)
  x_adv = attacks.cw_authors(apply_fn, params, x, y, key)
  unscaled = attacks.cw_authors(apply_fn, params, x, y, key, scale=1.0)
  delta = np.abs(np.asarray(x_adv) - np.asarray(x))
  unscaled = np.asarray(unscaled)
  inside = (unscaled > 0) & (unscaled < 1)   # where clip(w) is w itself
  assert inside.mean() > 0.9
  # multiplied by 0.031, not clipped to 8/255: far inside the ball
  np.testing.assert_allclose(
      delta[inside], 0.031 * np.abs(unscaled - np.asarray(x))[inside],
      atol=1e-6)
  assert delta.max() < 8 / 255
  accuracy = lambda z: float(jnp.mean(jnp.argmax(apply_fn(params, z, None),
                                                  -1) == y))
  cw = attacks.cw_linf(apply_fn, params, x, y, key, unroll=1)
  assert accuracy(x_adv) > accuracy(cw)
