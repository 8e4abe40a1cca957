"""Which images each attack attacks: the Evaluator's active sets, and the
strong protocol's plan (AutoAttack's and torchattacks' order)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import attacks
from fkjax import eval_strong
from fkjax import evaluate


def _linear(params, images, key):
  del key
  return images.reshape(images.shape[0], -1) @ params["w"]


@pytest.fixture(scope="module")
def batches_and_params():
  rng = np.random.default_rng(3)
  params = {"w": jnp.asarray(rng.normal(size=(12, 4)), jnp.float32)}
  images = rng.uniform(size=(2, 8, 2, 2, 3)).astype(np.float32)
  labels = rng.integers(0, 4, (2, 8)).astype(np.int32)
  predicted = np.asarray(_linear(params, jnp.asarray(
      images.reshape(16, 2, 2, 3)), None)).argmax(-1).reshape(2, 8)
  labels[:, :5] = predicted[:, :5]   # 5 or more of 8 right when clean
  return params, [{"image": images[i], "label": labels[i]} for i in range(2)]


def test_an_attack_can_follow_only_the_attacks_it_names(batches_and_params):
  params, batches = batches_and_params
  sizes = []

  def strong(apply_fn, variables, images, labels, key):
    n = images.shape[0]   # static: the bucket the evaluator gathered
    jax.debug.callback(lambda: sizes.append(n))
    return attacks.fgsm(apply_fn, variables, images, labels, key,
                        epsilon=0.5)

  suite = {"natural": evaluate.natural,
           "fgsm": functools.partial(attacks.fgsm, epsilon=0.3),
           "strong": strong}
  every = evaluate.Evaluator(_linear, suite)(params, batches,
                                             jax.random.key(9), per_image=True)
  sizes.clear()
  after_clean = evaluate.Evaluator(
      _linear, suite, survivors_only={"strong": ["natural"]})(
          params, batches, jax.random.key(9), per_image=True)
  clean = every.per_image["natural"]
  # Attacked: the images right when clean (FGSM's survivors included or
  # not), in buckets of the next power of two.
  want = [min(8, 1 << int(np.ceil(np.log2(clean[s:s + 8].sum()))))
          for s in (0, 8)]
  assert sizes == want
  np.testing.assert_array_equal(after_clean.per_image["strong"],
                                clean & every.per_image["strong"])
  np.testing.assert_array_equal(after_clean.per_image["fgsm"],
                                every.per_image["fgsm"])
  with pytest.raises(ValueError, match="only attacks that run before it"):
    evaluate.Evaluator(_linear, suite, survivors_only={"fgsm": ["strong"]})
  with pytest.raises(ValueError, match="unknown attacks"):
    evaluate.Evaluator(_linear, suite, survivors_only={"nope": ["natural"]})


def test_the_strong_protocol_attacks_only_what_autoattack_attacks():
  suite = ["natural", "apgd_ce", "apgd_dlr", "apgd_t"]
  assert eval_strong.survivors_plan(suite, True) == {
      "apgd_ce": ["natural"], "apgd_dlr": ["natural"],
      "apgd_t": ["natural", "apgd_ce", "apgd_dlr"]}
  assert eval_strong.survivors_plan(suite, False) == {
      "apgd_ce": ["natural"], "apgd_dlr": ["natural"],
      "apgd_t": ["natural"]}
  # Without the clean images in the suite, nothing to follow but APGD-T's.
  assert eval_strong.survivors_plan(suite[1:], True) == {
      "apgd_t": ["apgd_ce", "apgd_dlr"]}
  assert eval_strong.survivors_plan(suite[1:], False) == {}
