"""Tests for fkjax.evaluate: masked accuracy, compile caching, tables, JSON."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import attacks
from fkjax import evaluate


def _linear(params, images, key):
  del key
  return images.reshape(images.shape[0], -1) @ params["w"]


def _noisy_linear(params, images, key):
  logits = _linear(params, images, None)
  return logits + 2.0 * jax.random.normal(key, (logits.size,)).reshape(
      logits.shape)


@pytest.fixture(scope="module")
def setup():
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(12, 4)), jnp.float32)}
  images = rng.uniform(size=(3, 8, 2, 2, 3)).astype(np.float32)
  labels = rng.integers(0, 4, (3, 8)).astype(np.int32)
  # Make some labels right, so clean accuracy is neither 0 nor 100%.
  predicted = np.asarray(
      _linear(params, jnp.asarray(images.reshape(24, 2, 2, 3)), None)
  ).argmax(-1).reshape(3, 8)
  labels[:, :5] = predicted[:, :5]
  mask = np.ones((3, 8), bool)
  mask[2, 5:] = False
  # Padding rows copy correctly classified rows, so counting them would
  # change the result.
  images[2, 5:] = images[2, :3]
  labels[2, 5:] = labels[2, :3]
  batches = [{"image": images[i], "label": labels[i], "mask": mask[i]}
             for i in range(3)]
  return params, batches


def _manual_correct(params, batches, attack):
  total = 0
  for batch in batches:
    x = jnp.asarray(batch["image"])
    y = jnp.asarray(batch["label"])
    x_adv = attack(_linear, params, x, y, jax.random.key(0))
    right = np.asarray(_linear(params, x_adv, None)).argmax(-1) == batch[
        "label"]
    total += int(np.sum(right & batch["mask"]))
  return total


def test_robust_accuracy_counts_only_real_examples_and_compiles_per_shape(
    setup):
  params, batches = setup
  fgsm = functools.partial(attacks.fgsm, epsilon=0.1)
  results = evaluate.robust_accuracy(
      _linear, params, batches, {"natural": evaluate.natural, "fgsm": fgsm},
      jax.random.key(1), progress=False)
  assert results["num_examples"] == 21
  natural = _manual_correct(params, batches, evaluate.natural)
  unmasked = sum(int(np.sum(np.asarray(_linear(
      params, jnp.asarray(b["image"]), None)).argmax(-1) == b["label"]))
                 for b in batches)
  assert natural != unmasked  # the mask matters for this data
  entry = results["attacks"]["natural"]
  assert entry["correct"] == natural
  assert entry["accuracy"] == pytest.approx(100.0 * natural / 21)
  # FGSM on a deterministic model needs no key: compare with a direct call.
  assert results["attacks"]["fgsm"]["correct"] == _manual_correct(
      params, batches, jax.jit(fgsm, static_argnums=0))
  assert results["attacks"]["fgsm"]["correct"] < natural
  for entry in results["attacks"].values():
    # The full batches, and the padded one cut to its 5 real rows.
    assert entry["num_compiles"] == 2
    assert entry["seconds"] >= entry["compile_seconds"] > 0.0


def test_robust_accuracy_compiles_once_per_batch_shape(setup):
  params, batches = setup
  small = {k: v[:4] for k, v in batches[0].items()}
  results = evaluate.robust_accuracy(
      _linear, params, [batches[0], small, batches[1], small],
      {"natural": evaluate.natural}, jax.random.key(2), progress=False)
  assert results["attacks"]["natural"]["num_compiles"] == 2
  assert results["num_examples"] == 8 + 4 + 8 + 4


def test_default_attacks_run_in_paper_order_and_table(setup, tmp_path):
  params, batches = setup
  default = evaluate.default_attacks(
      nattack_iters=3, nattack_population=8, ifgsm_steps=2, cw_steps=2,
      epsilon=0.1, step_size=0.05)
  assert list(default) == ["natural", "fgsm", "ifgsm20", "cw", "nattack"]
  assert list(default) == list(evaluate.PAPER_COLUMNS)
  results = evaluate.robust_accuracy(
      _noisy_linear, params, batches[:1], default, jax.random.key(3),
      num_noise_draws=3, progress=True)
  assert results["num_noise_draws"] == 3
  accuracies = [e["accuracy"] for e in results["attacks"].values()]
  assert all(0.0 <= a <= 100.0 for a in accuracies)

  table = evaluate.format_table(results, sparsity=12.345,
                                channel_sparsity=6.0)
  header, rule, row = table.splitlines()
  for label in ["A1 natural", "A2 FGSM", "A3 IFGSM20", "A4 C&W", "A5 NAttack",
                "Sparsity", "Ch. Sp."]:
    assert label in header
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells == [f"{a:.2f}" for a in accuracies] + ["12.35", "6.00"]
  assert set(rule) <= {"|", "-"}
  assert "Sparsity" not in evaluate.format_table(results)

  path = tmp_path / "sub" / "results.json"
  evaluate.save_json(results, path)
  assert json.loads(path.read_text()) == results


def test_predict_probs_averages_softmax_over_noise_draws(setup):
  params, batches = setup
  x = jnp.asarray(batches[0]["image"])
  key = jax.random.key(4)
  predict = lambda fn, k: jax.jit(functools.partial(
      evaluate.predict_probs, fn, num_noise_draws=k))(params, x, key)
  # A deterministic model gives the same probabilities for any draw count.
  np.testing.assert_allclose(predict(_linear, 1), predict(_linear, 4),
                             rtol=1e-5)
  probs = predict(_noisy_linear, 4)
  manual = jnp.mean(jnp.stack([
      jax.nn.softmax(_noisy_linear(params, x, k))
      for k in jax.random.split(key, 4)]), axis=0)
  np.testing.assert_allclose(probs, manual, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jnp.sum(probs, -1), 1.0, rtol=1e-5)
  # More draws change the answer for the noisy model (it is really noisy).
  assert float(jnp.max(jnp.abs(probs - predict(_noisy_linear, 1)))) > 1e-3
