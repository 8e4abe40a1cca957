"""Tests for fkjax.evaluation: masked accuracy, compile caching, tables, JSON."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import attacks
from fkjax.evaluation import strong as eval_strong
from fkjax.evaluation import strong_result as eval_strong_result
from fkjax import evaluation
from fkjax import models
from fkjax import workdir as workdir_lib


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
  results = evaluation.robust_accuracy(
      _linear, params, batches, {"natural": evaluation.natural, "fgsm": fgsm},
      jax.random.key(1), progress=False)
  assert results.num_examples == 21
  natural = _manual_correct(params, batches, evaluation.natural)
  unmasked = sum(int(np.sum(np.asarray(_linear(
      params, jnp.asarray(b["image"]), None)).argmax(-1) == b["label"]))
                 for b in batches)
  assert natural != unmasked  # the mask matters for this data
  entry = results.attacks["natural"]
  assert entry.correct == natural
  assert entry.accuracy == pytest.approx(100.0 * natural / 21)
  # FGSM on a deterministic model needs no key: compare with a direct call.
  assert results.attacks["fgsm"].correct == _manual_correct(
      params, batches, jax.jit(fgsm, static_argnums=0))
  assert results.attacks["fgsm"].correct < natural
  for entry in results.attacks.values():
    # The full batches, and the padded one cut to its 5 real rows.
    assert entry.num_compiles == 2
    assert entry.seconds >= entry.compile_seconds > 0.0


def test_robust_accuracy_compiles_once_per_batch_shape(setup):
  params, batches = setup
  small = {k: v[:4] for k, v in batches[0].items()}
  results = evaluation.robust_accuracy(
      _linear, params, [batches[0], small, batches[1], small],
      {"natural": evaluation.natural}, jax.random.key(2), progress=False)
  assert results.attacks["natural"].num_compiles == 2
  assert results.num_examples == 8 + 4 + 8 + 4


def test_default_attacks_run_in_paper_order_and_table(setup, tmp_path):
  params, batches = setup
  default = evaluation.default_attacks(
      nattack_iters=3, nattack_population=8, ifgsm_steps=2, cw_steps=2,
      epsilon=0.1, step_size=0.05)
  assert list(default) == ["natural", "fgsm", "ifgsm20", "cw", "nattack"]
  assert list(default) == list(evaluation.PAPER_COLUMNS)
  results = evaluation.robust_accuracy(
      _noisy_linear, params, batches[:1], default, jax.random.key(3),
      num_noise_draws=3, progress=True)
  assert results.num_noise_draws == 3
  accuracies = [e.accuracy for e in results.attacks.values()]
  assert all(0.0 <= a <= 100.0 for a in accuracies)

  table = evaluation.format_table(results, sparsity=12.345,
                                channel_sparsity=6.0)
  header, rule, row = table.splitlines()
  for label in ["A1 natural", "A2 FGSM", "A3 IFGSM20", "A4 C&W", "A5 NAttack",
                "Sparsity", "Ch. Sp."]:
    assert label in header
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells == [f"{a:.2f}" for a in accuracies] + ["12.35", "6.00"]
  assert set(rule) <= {"|", "-"}
  assert "Sparsity" not in evaluation.format_table(results)

  path = tmp_path / "sub" / "results.json"
  workdir_lib.write_results(path, results.to_json(), {})
  loaded = json.loads(path.read_text())
  assert loaded.pop("metadata") == {} and loaded == results.to_json()


def test_predict_probs_averages_softmax_over_noise_draws(setup):
  params, batches = setup
  x = jnp.asarray(batches[0]["image"])
  key = jax.random.key(4)
  predict = lambda fn, k: jax.jit(functools.partial(
      evaluation.predict_probs, fn, num_noise_draws=k))(params, x, key)
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


# --- per-image results and the worst case ------------------------------------


def _result_of(per_image):
  """An ``EvalResult`` with these per-image vectors (its counts from them)."""
  n = len(next(iter(per_image.values())))
  return evaluation.EvalResult(
      num_examples=n, num_noise_draws=1, predict_compile_seconds=0.0,
      attacks={name: evaluation.AttackResult(
          accuracy=100.0 * right.mean(), correct=int(right.sum()),
          seconds=0.0, compile_seconds=0.0, num_compiles=0)
               for name, right in per_image.items()},
      per_image=per_image)


def test_worst_case_counts_each_image_once():
  results = _result_of({"natural": np.array([1, 1, 1, 1, 0], bool),
                        "a": np.array([0, 1, 1, 1, 0], bool),
                        "b": np.array([0, 0, 1, 1, 0], bool)})
  # Image 0 is broken by both attacks, image 4 is wrong when clean: the
  # worst case is images 2 and 3, not 5 minus the 6 breaks.
  worst = evaluation.worst_case(results)
  assert (worst.accuracy, worst.correct, worst.num_examples, worst.attacks
          ) == (40.0, 2, 5, ("natural", "a", "b"))
  np.testing.assert_array_equal(worst.robust, [0, 0, 1, 1, 0])
  assert evaluation.worst_case(results, ["a"]).correct == 3


def test_per_image_vectors_and_worst_case_from_an_evaluation(setup):
  params, batches = setup
  suite = {"natural": evaluation.natural,
           "fgsm": functools.partial(attacks.fgsm, epsilon=0.05),
           "fgsm_big": functools.partial(attacks.fgsm, epsilon=0.2)}
  results = evaluation.robust_accuracy(_linear, params, batches, suite,
                                     jax.random.key(1), progress=False,
                                     per_image=True)
  per_image = results.per_image
  for name, entry in results.attacks.items():
    assert per_image[name].shape == (21,)  # real rows only, in order
    assert int(per_image[name].sum()) == entry.correct
  worst = evaluation.worst_case(results)
  manual = per_image["natural"] & per_image["fgsm"] & per_image["fgsm_big"]
  assert worst.correct == int(manual.sum())
  assert worst.correct <= min(e.correct
                                 for e in results.attacks.values())


# --- padding -----------------------------------------------------------------


def _batch_std_model(params, images, key):
  """A linear layer with EnResNet's batch-std noise: one std per batch."""
  hidden = images.reshape(images.shape[0], -1) @ params["w"]
  return models.inject_noise(hidden, 1.0, key, std_over="batch")


def _padded(num_real, num_padding, seed):
  rng = np.random.default_rng(seed)
  size = num_real + num_padding
  images = rng.uniform(size=(size, 2, 2, 3)).astype(np.float32)
  images[num_real:] = 0.0  # eval_batches pads with zero images, label 0
  labels = np.zeros(size, np.int32)
  labels[:num_real] = rng.integers(0, 4, num_real)
  return {"image": images, "label": labels, "mask": np.arange(size) < num_real}


def test_padding_rows_no_longer_change_the_real_rows(setup):
  params, _ = setup
  padded = _padded(6, 10, seed=5)
  key = jax.random.key(6)
  logits_alone = _batch_std_model(params, jnp.asarray(padded["image"][:6]),
                                  key)
  logits_padded = _batch_std_model(params, jnp.asarray(padded["image"]),
                                   key)[:6]
  # The defect: zero rows change std(out) and so the real rows' noise.
  assert float(jnp.max(jnp.abs(logits_padded - logits_alone))) > 1e-2
  real = evaluation.real_rows(padded)
  assert set(real) == {"image", "label"}
  np.testing.assert_array_equal(
      _batch_std_model(params, jnp.asarray(real["image"]), key), logits_alone)

  # A mask with holes keeps the real rows in order; no real row: None.
  holes = {"image": padded["image"][:4], "label": np.arange(4),
           "mask": np.array([True, False, True, False])}
  np.testing.assert_array_equal(evaluation.real_rows(holes)["label"], [0, 2])
  assert evaluation.real_rows({**holes, "mask": np.zeros(4, bool)}) is None


def test_evaluator_predicts_a_padded_batch_as_its_real_rows_alone(setup):
  params, _ = setup
  padded = _padded(32, 32, seed=5)
  alone = {"image": padded["image"][:32], "label": padded["label"][:32]}
  key = jax.random.key(6)

  def run(batch):
    return evaluation.robust_accuracy(
        _batch_std_model, params, [batch], {"natural": evaluation.natural},
        key, progress=False, per_image=True).per_image["natural"]

  np.testing.assert_array_equal(run(padded), run(alone))
  # Feeding the padding to the model (as before) changes some predictions
  # with this key, so the equality above is not a coincidence.
  predict_key = jax.random.split(jax.random.fold_in(key, 0), 2)[0]
  right = lambda images: np.asarray(jnp.argmax(_batch_std_model(
      params, jnp.asarray(images), predict_key), -1))[:32] == alone["label"]
  assert np.any(right(padded["image"]) != right(alone["image"]))


# --- seeds and the strong protocol -------------------------------------------


def test_repeat_evaluation_reports_mean_and_spread(setup):
  params, batches = setup
  evaluator = evaluation.Evaluator(
      _noisy_linear, {"natural": evaluation.natural,
                      "fgsm": functools.partial(attacks.fgsm, epsilon=0.05)})
  results = evaluation.repeat_evaluation(evaluator, params, batches,
                                       jax.random.key(7), num_seeds=3)
  assert results.num_seeds == 3
  for name in ("natural", "fgsm"):
    entry = results.attacks[name]
    spread = entry.accuracy
    assert len(spread.per_seed) == 3
    assert spread.mean == pytest.approx(np.mean(spread.per_seed))
    assert spread.std == pytest.approx(np.std(spread.per_seed, ddof=1))
    assert entry.num_compiles == 2
  # The noisy model's accuracy varies over seeds.
  assert results.attacks["natural"].accuracy.std > 0
  worst = results.worst_case
  seeds = worst.each_seed
  assert len(seeds.per_seed) == 3 == worst.num_seeds
  assert seeds.mean == pytest.approx(np.mean(seeds.per_seed))
  # An image broken under ANY seed is broken: at most the fewest robust of
  # any seed, and here fewer (the noise breaks different images per seed).
  assert worst.accuracy <= min(seeds.per_seed) + 1e-9
  assert worst.accuracy < seeds.mean
  robust = workdir_lib.decode_correct(
      worst.to_json()["correct_per_image"], 21)
  np.testing.assert_array_equal(robust, worst.robust)
  assert worst.correct == int(robust.sum())
  assert worst.accuracy == pytest.approx(100 * worst.correct / 21)
  # Batches read once (an iterator) cannot be repeated.
  with pytest.raises(TypeError, match="fresh iterable"):
    evaluation.repeat_evaluation(evaluator, params, iter(batches),
                               jax.random.key(7))


def test_strong_attacks_presets():
  stochastic = evaluation.strong_attacks(stochastic=True, targeted=True)
  assert list(stochastic) == ["natural", "apgd_ce", "apgd_dlr", "apgd_t"]
  assert stochastic["apgd_ce"].keywords["eot_samples"] == 20
  assert stochastic["apgd_ce"].keywords["check_draws"] == 3
  assert stochastic["apgd_t"].keywords["loss"] == "dlr_targeted"
  deterministic = evaluation.strong_attacks(4 / 255, num_iters=50)
  # APGD-T by default, as AutoAttack's standard version.
  assert list(deterministic) == ["natural", "apgd_ce", "apgd_dlr", "apgd_t"]
  assert deterministic["apgd_t"].keywords["num_targets"] == 9
  assert list(evaluation.strong_attacks(targeted=False)) == [
      "natural", "apgd_ce", "apgd_dlr"]
  assert deterministic["apgd_dlr"].keywords == {
      "loss": "dlr", "epsilon": 4 / 255, "num_iters": 50, "n_restarts": 1,
      "eot_samples": 1, "check_draws": 0, "skip_misclassified": False}


@pytest.mark.slow
def test_strong_evaluation_writes_a_self_describing_result(setup, tmp_path):
  params, batches = setup
  results = evaluation.strong_evaluation(
      _noisy_linear, params, batches[:2], jax.random.key(8), epsilon=0.1,
      stochastic=True, eot_samples=2, check_draws=1, num_noise_draws=2,
      num_iters=3, num_seeds=2, num_targets=2, sanity_batches=batches[:1],
      # APGD-T on every image: compiled once, not once per survivors'
      # bucket size (3 here); test_an_attack_on_survivors_... and the
      # journal's strong tests run the survivors' path.
      targeted_on_survivors=False,
      # sweep_steps=1 makes the sweep at 0.1 the PGD-1 attack (run once).
      sanity_options=dict(sweep_epsilons=(0.0, 0.1), sweep_steps=1,
                          steps=(1, 2), nattack_population=4,
                          nattack_iters=2))
  assert results.to_json()["protocol"] == "strong"
  assert results.settings.eot_samples == 2
  assert results.settings.num_noise_draws == 2
  assert results.num_noise_draws == 2
  assert results.names == ["natural", "apgd_ce", "apgd_dlr", "apgd_t"]
  assert results.worst_case.attacks == ("natural", "apgd_ce", "apgd_dlr",
                                        "apgd_t")
  assert results.settings.num_targets == 2
  assert results.settings.targeted_on_survivors is False
  assert "left robust" not in results.description
  assert results.num_examples == 16
  sanity = results.sanity
  assert {c["name"] for c in sanity["checks"]} == {
      "epsilon_sweep", "sweep_reaches_zero", "apgd_converged", "more_steps",
      "more_eot", "blackbox_weaker"}
  # The sanity checks test the reported APGD at its own budget.
  assert sanity["settings"]["apgd_budget"] == [3, 1]
  text = evaluation.format_strong(results)
  assert "worst case" in text and "APGD-T" in text and "+-" in text
  assert "every attack, every seed" in text
  assert "sanity checks" in text

  path = tmp_path / "strong.json"
  workdir_lib.write_results(path, results.to_json(), {})
  loaded = json.loads(path.read_text())
  assert loaded["per_image"]["apgd_ce"] == results.per_image[
      "apgd_ce"].tolist()
  assert loaded["sanity"]["passed"] == sanity["passed"]
  assert eval_strong_result.StrongResult.from_json(loaded) == results


def test_eval_says_up_front_what_it_costs_and_how_to_bound_it():
  from configs import cpu  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import cost as eval_cost  # pylint: disable=import-outside-toplevel
  config = cpu.get_config()
  names = config.eval.attacks.split(",")
  costs = eval_cost.attack_costs(names, config)
  # The README demo's NAttack: 20 iterations of 50 + 3 success draws.
  assert costs["nattack"] == 20 * 53 + 1
  # IFGSM^20 on the noisy net: 20 gradients (3 each) and 20 check draws.
  assert costs["ifgsm20"] == 20 * 4 + 1
  # The authors' C&W: 50 gradients, whatever the paper's attacks' steps.
  assert eval_cost.attack_costs(["cw_authors"], config)["cw_authors"] == (
      50 * 3 + 1)
  text = eval_cost.cost_summary(names, config, 250)
  assert "250 test images in batches of 50" in text
  assert "nattack is most of the time" in text
  assert "--config.eval.attacks=natural,fgsm,ifgsm20,cw" in text
  assert "--config.eval.num_examples=N" in text
  # Without NAttack no attack dominates: no advice to leave one out.
  short = eval_cost.cost_summary(["natural", "fgsm", "ifgsm20", "cw"], config,
                                250)
  assert "leaves it out" not in short


# The keyword that sets each attack's number of iterations in its suite.
_ITERATIONS = {"ifgsm20": "num_steps", "cw": "num_steps",
               "cw_authors": "num_steps", "nattack": "max_iters"}


@pytest.mark.parametrize("name", sorted(_ITERATIONS))
def test_an_attack_s_cost_follows_its_suite_s_iterations(name, monkeypatch):
  from configs import cpu  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import cost as eval_cost  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import suites as eval_suites  # pylint: disable=import-outside-toplevel
  config = cpu.get_config()
  before = eval_cost.attack_costs([name], config)[name]
  # The suites with this attack's iterations doubled: its cost (beyond the
  # final prediction's forward pass) doubles with them.
  for suite_name, build in list(eval_suites.SUITES.items()):
    def doubled(*args, build=build, **kwargs):
      suite = build(*args, **kwargs)
      if name in suite:
        attack = suite[name]
        key = _ITERATIONS[name]
        suite[name] = functools.partial(
            attack.func, **{**attack.keywords, key: 2 * attack.keywords[key]})
      return suite
    monkeypatch.setitem(eval_suites.SUITES, suite_name, doubled)
  after = eval_cost.attack_costs([name], config)[name]
  assert after - 1 == 2 * (before - 1)


def test_an_attack_on_survivors_gets_only_the_images_left_robust(setup):
  params, batches = setup
  sizes = []

  def strong(apply_fn, variables, images, labels, key):
    n = images.shape[0]   # static: the bucket the evaluator gathered
    jax.debug.callback(lambda: sizes.append(n))
    return attacks.fgsm(apply_fn, variables, images, labels, key,
                        epsilon=0.5)

  counts = [8, 8, 5]   # the real rows of each batch
  starts = np.cumsum([0, 8, 8])

  def buckets(alive):
    # the next power of two of each batch's images left alive, if any
    return [min(n, 1 << int(np.ceil(np.log2(alive[s:s + n].sum()))))
            for s, n in zip(starts, counts) if alive[s:s + n].any()]

  suite = {"natural": evaluation.natural,
           "fgsm": functools.partial(attacks.fgsm, epsilon=0.3),
           "strong": strong}
  every = evaluation.Evaluator(_linear, suite)(params, batches,
                                             jax.random.key(9), per_image=True)
  assert sizes == counts
  sizes.clear()
  cascade = evaluation.Evaluator(_linear, suite, survivors_only=["strong"])(
      params, batches, jax.random.key(9), per_image=True)
  alive = every.per_image["natural"] & every.per_image["fgsm"]
  # Only the images the first two left right were attacked, in buckets of
  # the next power of two; FGSM on this model treats each image alone, so
  # the result is the worst case over the three, image by image.
  assert sizes == buckets(alive)
  assert sum(sizes) < 21, (sizes, alive)
  np.testing.assert_array_equal(cascade.per_image["strong"],
                                alive & every.per_image["strong"])
  for name in ("natural", "fgsm"):
    np.testing.assert_array_equal(cascade.per_image[name],
                                  every.per_image[name])
  # A mapping names the attacks whose survivors an attack gets: here the
  # images right when clean, whatever FGSM did.
  sizes.clear()
  after_clean = evaluation.Evaluator(
      _linear, suite, survivors_only={"strong": ["natural"]})(
          params, batches, jax.random.key(9), per_image=True)
  clean = every.per_image["natural"]
  assert sizes == buckets(clean)
  np.testing.assert_array_equal(after_clean.per_image["strong"],
                                clean & every.per_image["strong"])
  np.testing.assert_array_equal(after_clean.per_image["fgsm"],
                                every.per_image["fgsm"])
  with pytest.raises(ValueError, match="survivors_only"):
    evaluation.Evaluator(_linear, suite, survivors_only=["nope"])
  with pytest.raises(ValueError, match="unknown attacks"):
    evaluation.Evaluator(_linear, suite, survivors_only={"nope": ["natural"]})
  with pytest.raises(ValueError, match="only attacks that run before it"):
    evaluation.Evaluator(_linear, suite, survivors_only={"fgsm": ["strong"]})


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


def test_attack_names_are_defined_once_and_the_rest_derived():
  from configs import cpu  # pylint: disable=import-outside-toplevel
  from fkjax.config import names as eval_names  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import cost as eval_cost  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import suites as eval_suites  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  names = eval_names.ATTACK_NAMES
  assert names == (*eval_names.PAPER_COLUMNS, *eval_names.AUTHORS_COLUMNS)
  assert list(eval_suites.default_attacks()) == list(eval_names.PAPER_COLUMNS)
  assert (list(eval_suites.authors_attacks())
          == list(eval_names.AUTHORS_COLUMNS))
  assert set(eval_suites.strong_attacks()) < set(eval_names.STRONG_COLUMNS)
  assert run_config._ATTACK_NAMES is names  # pylint: disable=protected-access
  config = cpu.get_config()
  assert tuple(eval_suites.attack_suite(",".join(names), config)) == names
  assert tuple(eval_cost.attack_costs(list(names), config)) == names
  # A name that exists nowhere is refused with the names that do.
  with pytest.raises(run_config.ConfigError,
                     match=r"unknown attacks \['fgsm_authors'\]; choose from "
                     r"\['natural', .*'cw_authors'\]"):
    eval_suites.attack_suite("natural,fgsm_authors", config)


def test_suites_and_protocols_are_registered_by_name():
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import suites as eval_suites  # pylint: disable=import-outside-toplevel
  assert {"paper", "authors", "strong"} <= set(eval_suites.SUITES)
  assert list(eval_suites.suite("strong", targeted=False)) == [
      "natural", "apgd_ce", "apgd_dlr"]
  assert list(eval_suites.suite("paper", eot_samples=3)) == list(
      evaluation.PAPER_COLUMNS)
  with pytest.raises(ValueError, match="unknown attack suite 'nope'"):
    eval_suites.suite("nope")
  with pytest.raises(ValueError, match="'paper' is registered twice"):
    eval_suites.register("paper")(dict)
  assert set(eval_run.PROTOCOLS) == {"paper", "strong"}


def test_a_tally_resumes_and_gives_the_result():
  from fkjax.evaluation import loop as eval_loop  # pylint: disable=import-outside-toplevel
  tally = eval_loop.Tally.resume(["natural", "fgsm"], True, None)
  tally.add_batch({"natural": (np.array([True, True, False]), 1.0),
                   "fgsm": (np.array([True, False, False]), 2.0)})
  state = tally.journal_state()
  assert state["num_examples"] == 3
  earlier = {**state, "batches_done": 1,
             "partial": {"batch_index": 1,
                         "attacks": {"natural": (np.array([True]), 0.5)}}}
  resumed = eval_loop.Tally.resume(["natural", "fgsm"], True, earlier)
  assert resumed.resumed_seconds == 3.5
  resumed.add_batch({"natural": (np.array([True]), 0.5),
                     "fgsm": (np.array([False]), 0.25)})
  result = resumed.result(2, {"natural": 1, "fgsm": 1})
  assert result.num_examples == 4 and result.num_noise_draws == 2
  assert result.accuracy("natural") == 75.0
  assert result.attacks["fgsm"].correct == 1
  assert result.attacks["fgsm"].seconds == 2.25
  np.testing.assert_array_equal(result.per_image["fgsm"],
                                [True, False, False, False])
  assert result.resumed_seconds == 3.5
  empty = eval_loop.Tally.resume(["natural"], False, None).result(
      1, {"natural": 0})
  assert np.isnan(empty.accuracy("natural"))
  assert empty.per_image is None
