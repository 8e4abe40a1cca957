"""Tests for the evaluation's progress in model calls (fkjax.evaluation)."""
import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import attacks
from fkjax import evaluation
from fkjax import kernels
from fkjax.evaluation import progress as eval_progress
from fkjax.workdir import metric_logging
from fkjax import models
from tests import tiny_models


_noisy_mlp = tiny_models.noisy_relu_mlp


@pytest.fixture(scope="module")
def mlp():
  params, images, labels = tiny_models.trained_mlp()
  return params, images[:6], labels[:6]


PGD = functools.partial(attacks.pgd, epsilon=0.1, step_size=0.03,
                        num_steps=4, eot_samples=2, return_best=True,
                        check_draws=2)
FGSM = functools.partial(attacks.fgsm, epsilon=0.1, eot_samples=3)


def _count(attack, args):
  """The traced count of ``attack`` on the counted model."""
  counted = evaluation.counting_apply(_noisy_mlp, lambda: None)
  return evaluation.count_model_calls(
      jax.jit(functools.partial(attack, counted)).trace(*args).jaxpr)


def test_counts_of_loops_restarts_and_early_stopping(mlp):
  params, images, labels = mlp
  count = lambda attack: _count(attack, (params, images, labels,
                                         jax.random.key(0)))
  # One call however many EOT draws a gradient averages (one vmap).
  assert count(FGSM) == 1
  # PGD-k with a fresh check of every iterate: k gradients + k checks.
  assert count(PGD) == 8
  # C&W written out step by step (unroll >= steps): one call per step.
  assert count(functools.partial(attacks.cw_linf, num_steps=3,
                                 unroll=3)) == 3
  assert count(functools.partial(attacks.cw_authors, num_steps=4)) == 4
  # APGD: the clean images' check, then the start and each iteration, a
  # gradient and a check each.
  apgd = functools.partial(attacks.apgd, epsilon=0.1, num_iters=3,
                           eot_samples=2, check_draws=1)
  assert count(apgd) == 9
  assert count(functools.partial(apgd, skip_misclassified=False)) == 8
  # A restart (or another target) is skipped once every image is fooled (a
  # cond): the count is an upper bound.
  assert count(functools.partial(apgd, n_restarts=3)) == 25
  # APGD-T: the targets' logits and the clean check, then per target the
  # start and each iteration (one call each: the gradient's logits are
  # judged).
  assert count(functools.partial(
      attacks.apgd, num_iters=2, loss="dlr_targeted", num_targets=2,
      check_draws=0)) == 8
  # NAttack: per iteration the mean's check (its draws vmapped) and the
  # population (one vmap, or one call per chunk), at most max_iters times;
  # it stops sooner once every image is fooled, so an upper bound.
  nattack = functools.partial(attacks.nattack, population=4, max_iters=3)
  assert count(nattack) == 6
  assert count(functools.partial(nattack, chunk=3)) == 9
  assert count(functools.partial(nattack, image_chunk=4)) == 12
  assert count(evaluation.natural) == 0


@pytest.mark.parametrize("attack, exact", [
    (functools.partial(attacks.apgd, epsilon=0.1, num_iters=2, eot_samples=2,
                       check_draws=1), True),
    (functools.partial(attacks.nattack, epsilon=0.1, population=4,
                       max_iters=2, chunk=2), False),
], ids=["apgd", "nattack"])
def test_counted_attacks_tick_per_call_and_give_identical_images(
    mlp, attack, exact):
  params, images, labels = mlp
  args = (params, images, labels, jax.random.key(5))
  counter = evaluation.CallCounter()
  seen = []
  counter.watch(seen.append)
  counted = evaluation.counting_apply(_noisy_mlp, counter.tick)
  plain = jax.jit(functools.partial(attack, _noisy_mlp))(*args)
  ticked = jax.jit(functools.partial(attack, counted))(*args)
  np.testing.assert_array_equal(np.asarray(ticked), np.asarray(plain))
  assert counter.count > 0 and seen == list(range(1, counter.count + 1))
  if exact:
    assert counter.count == _count(attack, args)


def test_chunked_calls_tick_once_per_chunk(mlp):
  params, images, _ = mlp
  counter = evaluation.CallCounter()
  counted = evaluation.counting_apply(_noisy_mlp, counter.tick)
  keys = jax.random.split(jax.random.key(1), 12)
  # NAttack's population in chunks of 5: a scan over two vmapped chunks,
  # then the remaining 2 keys.
  draws = jax.jit(lambda k: jax.lax.map(
      lambda kk: counted(params, images, kk), k, batch_size=5))
  jax.block_until_ready(draws(keys))
  assert counter.count == 3


def test_progress_off_compiles_no_callback_and_changes_no_result(mlp):
  params, images, labels = mlp
  suite = {"natural": evaluation.natural, "fgsm": FGSM}
  batches = [{"image": images[:3], "label": labels[:3]},
             {"image": images[3:], "label": labels[3:]}]
  evaluator = evaluation.Evaluator(_noisy_mlp, suite)
  ticks = []
  evaluator.calls.watch(ticks.append)  # would see any callback
  off = evaluator(params, batches, jax.random.key(2), per_image=True)
  assert ticks == [] and evaluator.calls.count == 0
  on = evaluator(params, batches, jax.random.key(2), per_image=True,
                 progress=True)
  for name in suite:
    np.testing.assert_array_equal(on.per_image[name], off.per_image[name])
    assert on.attacks[name].correct == off.attacks[name].correct


def _halving(apply_fn, variables, images, labels, key):
  """An attack whose model calls depend on the data: a loop that calls the
  model until a value, halved each time, drops below 0.1 (4 calls)."""
  def body(value):
    apply_fn(variables, images, key)
    return value * 0.5
  jax.lax.while_loop(lambda v: v > 0.1, body, jnp.asarray(1.0))
  return images


def _progress_lines(mlp, monkeypatch, suite, work_per_image=None):
  params, images, labels = mlp
  stream = io.StringIO()
  monkeypatch.setattr(metric_logging, "progress", functools.partial(
      metric_logging.progress, stream=stream, interval=0.0))
  batches = [{"image": images[:3], "label": labels[:3]},
             {"image": images[3:], "label": labels[3:]}]
  evaluation.robust_accuracy(_noisy_mlp, params, batches, suite,
                           jax.random.key(3), progress=True,
                           work_per_image=work_per_image)
  return stream.getvalue().splitlines()


def test_progress_lines_count_model_calls(mlp, monkeypatch):
  # At this radius NAttack never succeeds and runs all 3 iterations, a
  # check and a population pass each: its bound, 6 calls.
  lines = _progress_lines(mlp, monkeypatch, {
      "natural": evaluation.natural, "fgsm": FGSM,
      "nattack": functools.partial(attacks.nattack, epsilon=1e-4,
                                   population=4, max_iters=3)})
  # Every call moves the display; one more line at the end.
  assert len(lines) == 2 * 7 + 1
  assert lines[0].startswith("robust accuracy, batch 1/2, fgsm call 1/1: "
                             "1/14 model calls (7%)")
  assert lines[1].startswith("robust accuracy, batch 1/2, nattack call 1/6: "
                             "2/14 model calls (14%)")
  assert lines[7].startswith("robust accuracy, batch 2/2, fgsm call 1/1: "
                             "8/14 model calls (57%)")
  assert lines[-1].startswith("robust accuracy, batch 2/2, nattack call 6/6: "
                              "14/14 model calls (100%)")


def test_progress_weighs_each_attacks_calls_by_its_work(mlp, monkeypatch):
  # FGSM: 4 units in its 1 call; NAttack: 60 units in its 6 calls, 10 a
  # call. The display moves by work, so an expensive attack's calls are not
  # taken for a cheap one's when the time left is estimated.
  lines = _progress_lines(mlp, monkeypatch, {
      "fgsm": FGSM,
      "nattack": functools.partial(attacks.nattack, epsilon=1e-4,
                                   population=4, max_iters=3)},
      work_per_image={"fgsm": 4, "nattack": 60})
  assert lines[0].startswith("robust accuracy, batch 1/2, fgsm call 1/1: "
                             "4/128 work units (3%)")
  assert lines[1].startswith("robust accuracy, batch 1/2, nattack call 1/6: "
                             "14/128 work units (11%)")
  assert lines[-1].startswith("robust accuracy, batch 2/2, nattack call 6/6: "
                              "128/128 work units (100%)")


def test_progress_of_calls_not_known_in_advance(mlp, monkeypatch):
  lines = _progress_lines(mlp, monkeypatch, {"fgsm": FGSM,
                                             "halving": _halving})
  assert len(lines) == 2 * 5 + 1
  # Batch 1: no total (the loop's calls are not known yet).
  assert lines[0].startswith("robust accuracy, batch 1/2, fgsm call 1/1: "
                             "1 model calls,")
  assert lines[1].startswith("robust accuracy, batch 1/2, halving call 1: "
                             "2 model calls,")
  # Batch 2: the loop's count of batch 1 is the estimate.
  assert lines[5].startswith("robust accuracy, batch 2/2, fgsm call 1/1: "
                             "6/10 model calls (60%)")
  assert lines[-1].startswith("robust accuracy, batch 2/2, halving call 4: "
                              "10/10 model calls (100%)")


def test_a_noisy_resnet_attacked_with_progress_gives_identical_images():
  model = models.create_model(depth=8, noise_coef=0.1)
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.uniform(size=(3, 8, 8, 3)), jnp.float32)
  labels = jnp.asarray([0, 1, 2], jnp.int32)
  variables = jax.jit(model.init)({"params": jax.random.key(0),
                                   "noise": jax.random.key(1)}, images)
  apply_fn = lambda v, x, k: model.apply(v, x, train=False,
                                         rngs={"noise": k})
  counter = evaluation.CallCounter()
  counted = evaluation.counting_apply(apply_fn, counter.tick)
  # A gradient through the noise, its EOT draws in a vmap.
  attack = functools.partial(attacks.fgsm, epsilon=8 / 255, eot_samples=2)
  args = (variables, images, labels, jax.random.key(5))
  plain = jax.jit(functools.partial(attack, apply_fn))(*args)
  ticked = jax.jit(functools.partial(attack, counted))(*args)
  np.testing.assert_array_equal(np.asarray(ticked), np.asarray(plain))
  assert counter.count == 1


def _ticking_loop(cond):
  """A program whose while loop ticks once per iteration, under ``cond``."""
  def program(x):
    def body(carry):
      i, y = carry
      jax.debug.callback(lambda: None, ordered=False)
      return i + 1, y * 0.5
    return jax.lax.while_loop(cond, body, (jnp.asarray(0, jnp.int32), x))[1]
  return jax.jit(program).trace(jnp.ones(3)).jaxpr


def test_a_while_loop_counts_only_under_a_counter_limit():
  assert evaluation.count_model_calls(_ticking_loop(
      lambda c: jnp.logical_and(jnp.any(c[1] > 0.1), c[0] < 5))) == 5
  # No limit on the counter, or one an "or" does not enforce: unknown.
  assert evaluation.count_model_calls(_ticking_loop(
      lambda c: jnp.any(c[1] > 0.1))) is None
  assert evaluation.count_model_calls(_ticking_loop(
      lambda c: jnp.logical_or(jnp.any(c[1] > 0.1), c[0] < 5))) is None


@pytest.mark.parametrize("fooled", [False, True])
def test_nattack_ticks_at_most_its_count_and_all_of_it_when_never_done(
    mlp, fooled):
  params, images, labels = mlp
  # A model whose prediction nothing changes (the true class by far), or
  # one every input fools (the wrong class by far).
  def fixed(variables, x, key):
    shift = jnp.where(fooled, (labels + 1) % 10, labels)
    return 100.0 * jax.nn.one_hot(shift, 10) + 0.0 * jnp.sum(x)
  attack = functools.partial(attacks.nattack, epsilon=0.1, population=4,
                             max_iters=3)
  args = (params, images, labels, jax.random.key(3))
  counter = evaluation.CallCounter()
  counted = evaluation.counting_apply(fixed, counter.tick)
  jax.block_until_ready(jax.jit(functools.partial(attack, counted))(*args))
  bound = evaluation.count_model_calls(jax.jit(
      functools.partial(attack, counted)).trace(*args).jaxpr)
  if fooled:   # done at the first check: one call, then the population's
    assert counter.count == 2 < bound
  else:
    assert counter.count == bound == 6


# --------------------------------------------------------------------------
# On a GPU or TPU: progress between attacks, no host callback.

_NATTACK = functools.partial(attacks.nattack, epsilon=1e-4, population=4,
                             max_iters=3)


def _lowered_text(apply_fn, attack, mlp, platform):
  params, images, labels = mlp
  return jax.jit(functools.partial(attack, apply_fn)).trace(
      params, images, labels, jax.random.key(0)).lower(
          lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("family,platform", [("gpu", "cuda"),
                                             ("tpu", "tpu")])
def test_an_accelerators_counted_attacks_have_no_host_callback(
    mlp, monkeypatch, family, platform):
  assert eval_progress.CallCounting(_noisy_mlp).per_call  # this CPU's
  monkeypatch.setenv(kernels.PLATFORM_ENV, family)
  counting = eval_progress.CallCounting(_noisy_mlp)
  assert not counting.per_call and counting.apply_fn is _noisy_mlp
  per_call = eval_progress.CallCounting(_noisy_mlp, per_call=True)
  # The same attack lowered: a callback only where asked for (JAX lowers a
  # host callback only for the backend it runs on: here the CPU).
  assert "callback" in _lowered_text(per_call.apply_fn, _NATTACK, mlp, "cpu")
  assert "callback" not in _lowered_text(counting.apply_fn, _NATTACK, mlp,
                                         platform)


def test_an_accelerators_progress_moves_between_attacks(mlp, monkeypatch):
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")
  lines = _progress_lines(mlp, monkeypatch, {"fgsm": FGSM,
                                             "nattack": _NATTACK},
                          work_per_image={"fgsm": 4, "nattack": 60})
  # One line per attack and batch, one more at the end.
  assert len(lines) == 2 * 2 + 1
  assert lines[0].startswith("robust accuracy, batch 1/2, fgsm done: "
                             "4/128 work units (3%)")
  assert lines[1].startswith("robust accuracy, batch 1/2, nattack done: "
                             "64/128 work units (50%)")
  assert lines[-1].startswith("robust accuracy, batch 2/2, nattack done: "
                              "128/128 work units (100%)")
  lines = _progress_lines(mlp, monkeypatch, {"fgsm": FGSM,
                                             "halving": _halving})
  assert lines[2].startswith("robust accuracy, batch 2/2, fgsm done: "
                             "3/4 attacks (75%)")


def test_an_accelerators_progress_changes_no_result(mlp, monkeypatch):
  params, images, labels = mlp
  batches = [{"image": images[:3], "label": labels[:3]},
             {"image": images[3:], "label": labels[3:]}]
  suite = {"fgsm": FGSM, "nattack": _NATTACK}
  off = evaluation.Evaluator(_noisy_mlp, suite)(
      params, batches, jax.random.key(2), per_image=True)
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")
  evaluator = evaluation.Evaluator(_noisy_mlp, suite)
  on = evaluator(params, batches, jax.random.key(2), per_image=True,
                 progress=True)
  for name in suite:
    np.testing.assert_array_equal(on.per_image[name], off.per_image[name])
    for compiled in evaluator.compiled_attacks(name, progress=True):
      assert "callback" not in compiled.as_text()
