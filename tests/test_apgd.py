"""Tests for fkjax.attacks.auto_pgd: schedule, DLR, strength, EOT."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import attacks
from fkjax import evaluation
from fkjax.attacks import auto_pgd
from tests import tiny_models

EPS = 8 / 255
BOUND_TOL = 1e-6


# --- losses ------------------------------------------------------------------


def test_dlr_losses_match_their_closed_forms():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(64, 10)).astype(np.float32)
  labels = rng.integers(0, 10, 64)
  targets = (labels + 1 + rng.integers(0, 9, 64)) % 10
  dlr = np.asarray(attacks.dlr(jnp.asarray(logits), jnp.asarray(labels)))
  dlr_t = np.asarray(attacks.dlr_targeted(
      jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(targets)))
  for i in range(64):
    z, y, t = logits[i].astype(np.float64), labels[i], targets[i]
    s = np.sort(z)[::-1]
    other = np.max(np.delete(z, y))
    assert dlr[i] == pytest.approx(-(z[y] - other) / (s[0] - s[2] + 1e-12),
                                   rel=1e-5, abs=1e-6)
    assert dlr_t[i] == pytest.approx(
        -(z[y] - z[t]) / (s[0] - 0.5 * (s[2] + s[3]) + 1e-12), rel=1e-5,
        abs=1e-6)
  # Positive exactly when misclassified; invariant to shifting and scaling.
  wrong = logits.argmax(-1) != labels
  np.testing.assert_array_equal(dlr > 0, wrong)
  scaled = np.asarray(attacks.dlr(jnp.asarray(7.0 * logits + 3.0),
                                  jnp.asarray(labels)))
  np.testing.assert_allclose(scaled, dlr, rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="at least 3"):
    attacks.dlr(jnp.zeros((2, 2)), jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match="at least 4"):
    attacks.dlr_targeted(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32),
                         jnp.ones(2, jnp.int32))


# --- the step-size schedule --------------------------------------------------


def test_checkpoints_by_hand():
  # p = 0, .22, .41, .57, .70, .80, .87, .93, .99 (next would be 1.05).
  assert auto_pgd.checkpoints(100) == (0, 22, 41, 57, 70, 80, 87, 93, 99)
  # ceil(p * 10) = 0, 3, 5, 6, 7, 8, 9, 10, 10: repeats collapse.
  assert auto_pgd.checkpoints(10) == (0, 3, 5, 6, 7, 8, 9, 10)


def test_halving_conditions_by_hand():
  # Window of 19 steps: condition 1 needs fewer than 0.75 * 19 = 14.25
  # increases.
  cases = [  # increases, halved_last, best, best_last -> halve
      (14, True, 2.0, 1.0, True),    # condition 1 only
      (15, True, 2.0, 1.0, False),   # neither (halved last: no condition 2)
      (15, False, 1.0, 1.0, True),   # condition 2 only: best loss stalled
      (15, False, 1.5, 1.0, False),  # best loss grew
      (3, False, 1.0, 1.0, True),    # both
  ]
  increases, halved_last, best, best_last, expected = (
      jnp.array(c) for c in zip(*cases))
  np.testing.assert_array_equal(
      auto_pgd.halving_decision(increases, 19, halved_last, best, best_last),
      expected)


def _expected_step_sizes(initial, halvings_at, num_iters=100):
  """Step of iteration k (x^(k) -> x^(k+1)): halved after each listed w."""
  return np.array([initial / 2.0**sum(w <= k for w in halvings_at)
                   for k in range(num_iters)])


def _binary_linear(params, images, key):
  del key
  return images.reshape(images.shape[0], -1) @ params["w"]


@pytest.fixture(scope="module")
def binary_linear():
  rng = np.random.default_rng(1)
  w = 0.2 * rng.normal(size=(48, 2)).astype(np.float32)
  images = rng.uniform(0.3, 0.7, (4, 4, 4, 3)).astype(np.float32)
  return {"w": jnp.asarray(w)}, jnp.asarray(images), jnp.zeros(4, jnp.int32)


def test_schedule_halves_at_every_checkpoint_when_the_loss_is_flat(
    binary_linear):
  """A constant loss never increases (condition 1) nor improves (2)."""
  params, images, labels = binary_linear

  def flat(params, images, key):
    return _binary_linear(params, 0.0 * images + 0.5, key)

  _, info = jax.jit(functools.partial(
      attacks.apgd, flat, num_iters=100, check_draws=0, return_info=True))(
          params, images, labels, jax.random.key(0))
  expected = _expected_step_sizes(2 * EPS, [22, 41, 57, 70, 80, 87, 93, 99])
  for image in range(4):
    np.testing.assert_allclose(info["step_size"][0, :, image], expected,
                               rtol=1e-6)


def test_schedule_on_a_ramp(binary_linear):
  """A linear loss climbed in tiny steps: by hand, halving starts at w_2.

  From ``x^(0) = x`` each step moves every pixel by ``eta = eps / 30.5``
  along the sign of the gradient (constant for a linear binary model), so
  the loss increases at steps 1..31 (step 31 reaches the ball's face) and
  is constant after. Window [0, 22): 22 increases >= 0.75 * 22 and the best
  loss grew: no halving. Window [22, 41): 9 increases < 0.75 * 19: halve.
  From then on the loss is flat: halve at every checkpoint.
  """
  params, images, labels = binary_linear
  _, info = jax.jit(functools.partial(
      attacks.apgd, _binary_linear, num_iters=100, check_draws=0,
      random_start=False, initial_step=1 / 30.5, return_info=True))(
          params, images, labels, jax.random.key(0))
  loss = np.asarray(info["loss"][0])
  steps = np.diff(loss, axis=0)
  assert np.all(steps[:31] > 0)
  assert np.all(steps[31:] == 0)
  expected = _expected_step_sizes(EPS / 30.5, [41, 57, 70, 80, 87, 93, 99])
  for image in range(4):
    np.testing.assert_allclose(info["step_size"][0, :, image], expected,
                               rtol=1e-6)


def _reference_schedule(loss, initial, num_iters, rho=0.75):
  """The paper's conditions replayed on a trace of one image's losses."""
  points = auto_pgd.checkpoints(num_iters)
  eta = np.empty(num_iters)
  step, current, best, best_last, halved_last, increases = (
      initial, loss[0], loss[0], loss[0], False, 0)
  causes = []
  for k in range(num_iters):
    eta[k] = step
    new = loss[k + 1]
    increases += new > current
    current, best = new, max(best, new)
    if k + 1 in points[1:]:
      j = points.index(k + 1)
      few = increases < rho * (points[j] - points[j - 1])
      stalled = not halved_last and best <= best_last
      halve = few or stalled
      causes.append((few, stalled))
      if halve:
        step /= 2
        current = best  # the search restarts from x_max
      increases, best_last, halved_last = 0, best, halve
  return eta, causes


def test_schedule_matches_the_conditions_replayed_on_a_trained_model():
  params, images, labels = tiny_models.trained_mlp()
  num_iters = 100
  _, info = jax.jit(functools.partial(
      attacks.apgd, tiny_models.relu_mlp, num_iters=num_iters, check_draws=0,
      return_info=True))(params, images, labels, jax.random.key(1))
  loss = np.asarray(info["loss"][0], np.float64)
  step_size = np.asarray(info["step_size"][0], np.float64)
  # The images misclassified when clean are set aside, not attacked.
  attacked = np.asarray(info["attacked"][0])
  clean = _robust(tiny_models.relu_mlp, params, images, labels)
  np.testing.assert_array_equal(attacked, clean)
  assert 0 < clean.sum() < images.shape[0]
  causes = []
  for image in np.flatnonzero(attacked):
    expected, image_causes = _reference_schedule(
        loss[:, image].astype(np.float32), 2 * EPS, num_iters)
    np.testing.assert_allclose(step_size[:, image], expected, rtol=1e-6)
    causes += image_causes
  # Restarts from x_max happen (no halving at all: test_schedule_on_a_ramp).
  assert np.array(causes).any()
  # A run that fooled nothing returns its highest-loss point.
  score = np.asarray(info["score"])
  kept = ~np.asarray(info["fooled"])
  np.testing.assert_allclose(score[kept], loss.max(axis=0)[kept], rtol=1e-6)


# --- strength ----------------------------------------------------------------


def _robust(apply_fn, params, x_adv, labels):
  return np.asarray(jnp.argmax(apply_fn(params, x_adv, None), -1) == labels)


@pytest.mark.slow
def test_apgd_at_least_as_strong_as_pgd_with_the_same_budget():
  """Image by image: at most 1 of 128 images survives APGD but not PGD."""
  params, images, labels = tiny_models.trained_mlp()
  f = tiny_models.relu_mlp
  key = jax.random.key(2)
  pgd = jax.jit(functools.partial(
      attacks.pgd, f, num_steps=20, random_start=True, return_best=True,
      check_draws=0, unroll=1))(params, images, labels, key)
  apgd, info = jax.jit(functools.partial(
      attacks.apgd, f, num_iters=20, check_draws=0, return_info=True))(
          params, images, labels, key)
  robust_pgd = _robust(f, params, pgd, labels)
  robust_apgd = _robust(f, params, apgd, labels)
  clean = _robust(f, params, images, labels)
  assert robust_pgd.sum() < 0.75 * clean.sum()  # PGD breaks many images
  assert robust_apgd.sum() <= robust_pgd.sum()
  assert np.sum(robust_apgd & ~robust_pgd) <= 1
  # The attack's own verdict agrees with the model's (deterministic model).
  np.testing.assert_array_equal(np.asarray(info["fooled"]), ~robust_apgd)
  for x_adv in (pgd, apgd):
    assert float(jnp.max(jnp.abs(x_adv - images))) <= EPS + BOUND_TOL
    assert 0.0 <= float(x_adv.min()) and float(x_adv.max()) <= 1.0


@pytest.mark.slow
def test_apgd_dlr_and_targeted_break_a_model_with_huge_logits():
  """Cross-entropy gradients vanish in float32 on saturated logits; DLR is
  scale invariant."""
  params, images, labels = tiny_models.trained_mlp()

  def saturated(params, images, key):
    return 1e4 * tiny_models.relu_mlp(params, images, key)

  key = jax.random.key(3)
  run = lambda **kw: _robust(saturated, params, jax.jit(functools.partial(
      attacks.apgd, saturated, num_iters=20, check_draws=0, **kw))(
          params, images, labels, key), labels).sum()
  ce, dlr = run(loss="ce"), run(loss="dlr")
  targeted = run(loss="dlr_targeted", num_targets=3)
  assert dlr < 0.75 * ce
  assert targeted < 0.75 * ce


def test_targets_are_the_top_other_classes():
  logits = jnp.array([[5.0, 1.0, 3.0, 2.0], [0.0, 9.0, 7.0, 8.0]])
  targets = auto_pgd.attack_targets(lambda v, x, k: x, None, logits,
                                    jnp.array([0, 3]), None, 2)
  np.testing.assert_array_equal(targets, [[2, 1], [3, 2]])


@pytest.mark.slow
def test_restarts_and_targets_respect_the_constraints():
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:16], labels[:16]
  x_adv, info = jax.jit(functools.partial(
      attacks.apgd, tiny_models.relu_mlp, loss="dlr_targeted", num_targets=2,
      n_restarts=2, num_iters=5, check_draws=1, return_info=True))(
          params, images, labels, jax.random.key(4))
  assert x_adv.shape == images.shape and x_adv.dtype == images.dtype
  assert float(jnp.max(jnp.abs(x_adv - images))) <= EPS + BOUND_TOL
  assert info["step_size"].shape == (4, 5, 16)  # 2 targets x 2 restarts
  robust = _robust(tiny_models.relu_mlp, params, x_adv, labels)
  np.testing.assert_array_equal(np.asarray(info["fooled"]), ~robust)


# --- EOT ---------------------------------------------------------------------


@pytest.mark.slow
def test_eot_apgd_beats_single_draw_apgd_on_a_model_with_misleading_draws():
  """Each draw adds ``a * N . sin(200 x)`` to the logits: tiny in value
  (std 0.3 against margins of 0.8) but its input gradient, ``200 a N .
  cos(200 x)``, swamps the linear part's. One draw's gradient points
  nowhere; 20 draws average the noise out."""
  rng = np.random.default_rng(7)
  w = rng.normal(size=(48, 2)).astype(np.float32)
  delta = w[:, 0] - w[:, 1]
  x = rng.uniform(0.3, 0.7, (32, 48)).astype(np.float32)
  # Margins 0.6 of what the best l_inf step of eps can remove.
  target = 0.6 * EPS * np.abs(delta).sum()
  x = x + ((target - x @ delta) / (delta @ delta))[:, None] * delta[None]
  params = {"w": jnp.asarray(w)}
  images = jnp.asarray(x.reshape(32, 4, 4, 3))
  labels = jnp.zeros(32, jnp.int32)

  def noisy(params, images, key):
    flat = images.reshape(images.shape[0], -1)
    noise = jax.random.normal(key, (flat.size * 2,)).reshape(
        flat.shape[0], 2, flat.shape[1])
    return flat @ params["w"] + 0.06 * jnp.einsum("bcd,bd->bc", noise,
                                                  jnp.sin(200.0 * flat))

  def accuracy(x_adv):
    probs = evaluation.predict_probs(noisy, params, x_adv, jax.random.key(9),
                                   num_noise_draws=32)
    return float(jnp.mean(jnp.argmax(probs, -1) == labels))

  run = lambda eot: accuracy(jax.jit(functools.partial(
      attacks.apgd, noisy, num_iters=40, eot_samples=eot, check_draws=3))(
          params, images, labels, jax.random.key(1)))
  clean, single, averaged = accuracy(images), run(1), run(20)
  assert clean == 1.0
  assert single > 0.8
  assert averaged < single - 0.5


# --- the active set ----------------------------------------------------------


def test_bucket_sizes():
  assert auto_pgd.bucket_sizes(500) == (63, 125, 250, 375, 500)
  assert auto_pgd.bucket_sizes(8) == (1, 2, 4, 6, 8)
  assert auto_pgd.bucket_sizes(64, max_buckets=3) == (32, 48, 64)
  assert auto_pgd.bucket_sizes(3) == (1, 2, 3)
  assert auto_pgd.bucket_sizes(1) == (1,)


def _apgd_t(compact, images, labels, params, **kw):
  return jax.jit(functools.partial(
      attacks.apgd, tiny_models.relu_mlp, loss="dlr_targeted", num_targets=9,
      num_iters=10, check_draws=0, compact=compact, return_info=True, **kw))(
          params, images, labels, jax.random.key(5))


@pytest.mark.parametrize("n_restarts", [1, 2])
@pytest.mark.slow
def test_targets_on_the_images_left_robust_break_the_same_images(n_restarts):
  """APGD-T attacking, target after target, only the images no target has
  fooled yet fools exactly the images that every target on every image
  fools, and each image's run is the same computation in both."""
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:48], labels[:48]
  x_all, all_info = _apgd_t(False, images, labels, params,
                            n_restarts=n_restarts)
  x_few, few_info = _apgd_t(True, images, labels, params,
                            n_restarts=n_restarts)
  robust = _robust(tiny_models.relu_mlp, params, x_all, labels)
  robust_few = _robust(tiny_models.relu_mlp, params, x_few, labels)
  np.testing.assert_array_equal(robust_few, robust)
  np.testing.assert_array_equal(np.asarray(few_info["fooled"]), ~robust)
  assert 0 < robust.sum() < 40  # some images break, some do not
  # Each image stays in its own ball (a misaligned gather would not).
  assert float(jnp.max(jnp.abs(x_few - images))) <= EPS + BOUND_TOL
  # An image never fooled went through every run in both: the same point.
  np.testing.assert_allclose(np.asarray(x_few)[robust],
                             np.asarray(x_all)[robust], atol=1e-6)
  # Run by run, an attacked image's losses are those of the same image and
  # run attacking everything (same random start, same steps).
  attacked = np.asarray(few_info["attacked"])
  for r in range(attacked.shape[0]):
    np.testing.assert_allclose(
        np.asarray(few_info["loss"][r])[:, attacked[r]],
        np.asarray(all_info["loss"][r])[:, attacked[r]], rtol=1e-5,
        atol=1e-6)


@pytest.mark.slow
def test_later_targets_attack_only_the_images_left_robust():
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:48], labels[:48]
  _, all_info = _apgd_t(False, images, labels, params)
  _, info = _apgd_t(True, images, labels, params)
  attacked = np.asarray(info["attacked"])
  assert attacked.shape == (9, 48)
  # The first target attacks the images classified right when clean.
  clean = _robust(tiny_models.relu_mlp, params, images, labels)
  np.testing.assert_array_equal(attacked[0], clean)
  # The active set only shrinks, and keeps every image never fooled.
  assert np.all(attacked[1:] <= attacked[:-1])
  assert np.all(attacked[-1] >= ~np.asarray(info["fooled"]))
  runs = int(info["image_runs"])
  assert runs == attacked.sum()
  assert runs < 48 * 9 == int(all_info["image_runs"])
  assert runs <= int(info["padded_image_runs"]) < 48 * 9


@pytest.mark.slow
def test_a_lone_run_attacks_only_the_images_classified_right():
  """As torchattacks' APGD: an image misclassified when clean is returned as
  it is and costs no run; the others are attacked as if it were not
  there."""
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:48], labels[:48]
  clean = _robust(tiny_models.relu_mlp, params, images, labels)
  assert 8 < clean.sum() < 40
  attack = lambda **kw: jax.jit(functools.partial(
      attacks.apgd, tiny_models.relu_mlp, loss="dlr", num_iters=10,
      check_draws=0, return_info=True, **kw))(
          params, images, labels, jax.random.key(8))
  x_adv, info = attack()
  x_every, every = attack(skip_misclassified=False)
  np.testing.assert_array_equal(np.asarray(info["attacked"][0]), clean)
  assert int(info["image_runs"]) == clean.sum()
  assert int(info["padded_image_runs"]) == min(
      s for s in auto_pgd.bucket_sizes(48) if s >= clean.sum())
  assert int(every["image_runs"]) == 48
  np.testing.assert_array_equal(np.asarray(x_adv)[~clean],
                                np.asarray(images)[~clean])
  np.testing.assert_array_equal(np.asarray(info["fooled"]),
                                ~_robust(tiny_models.relu_mlp, params, x_adv,
                                         labels))
  # The images attacked either way: the same run, the same points.
  np.testing.assert_allclose(np.asarray(x_adv)[clean],
                             np.asarray(x_every)[clean], atol=1e-6)
  np.testing.assert_array_equal(np.asarray(info["fooled"])[clean],
                                np.asarray(every["fooled"])[clean])


@pytest.mark.slow
def test_set_aside_by_the_check_of_a_noisy_model():
  """A noisy model's clean images pass the iterates' check: ``check_draws``
  fresh draws, all of which must misclassify for an image to be set
  aside."""
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:48], labels[:48]
  set_aside = {}
  for draws in (1, 4):
    _, info = jax.jit(functools.partial(
        attacks.apgd, tiny_models.noisy_relu_mlp, num_iters=2,
        check_draws=draws, return_info=True))(
            params, images, labels, jax.random.key(9))
    set_aside[draws] = ~np.asarray(info["attacked"][0])
  # Four draws that must all misclassify set fewer images aside than one.
  assert 0 < set_aside[4].sum() < set_aside[1].sum()


def _counting(apply_fn):
  calls = []

  def counted(params, images, key):
    jax.debug.callback(lambda: calls.append(1))
    return apply_fn(params, images, key)
  return counted, calls


@pytest.mark.parametrize("noisy", [False, True])
@pytest.mark.slow
def test_check_draws_default_checks_a_fresh_draw_only_for_a_noisy_model(
    noisy):
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:8], labels[:8]
  model = tiny_models.noisy_relu_mlp if noisy else tiny_models.relu_mlp
  calls = {}
  for draws in (None, 0, 1):
    counted, seen = _counting(model)
    jax.block_until_ready(jax.jit(functools.partial(
        attacks.apgd, counted, num_iters=10, check_draws=draws))(
            params, images, labels, jax.random.key(6)))
    calls[draws] = len(seen)
  # 11 gradient passes; a check costs 11 more; the default's probe 2.
  assert calls[1] == calls[0] + 11
  assert calls[None] == (calls[1] if noisy else calls[0]) + 2
  # Said by the caller, the model needs no probe.
  counted, seen = _counting(model)
  jax.block_until_ready(jax.jit(functools.partial(
      attacks.apgd, counted, num_iters=10, stochastic=noisy))(
          params, images, labels, jax.random.key(6)))
  assert len(seen) == calls[1 if noisy else 0]
