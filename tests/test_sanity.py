"""Tests for fkjax.evaluation.sanity: the report flags masked gradients, not models."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax.evaluation import sanity
from tests import tiny_models

# A short sweep and small attacks keep the test fast; the checks are the
# same as with the defaults.
_OPTIONS = dict(sweep_epsilons=(0.0, 8 / 255, 64 / 255), steps=(10, 40),
                apgd_budget=(10, 1),
                nattack_population=50, nattack_iters=50)


def _batches():
  params, images, labels = tiny_models.trained_mlp()
  return params, [{"image": images[:64], "label": labels[:64]},
                  {"image": images[64:], "label": labels[64:]}]


def test_paired_excess_by_hand():
  stronger = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 0], bool)
  weaker = np.array([1, 0, 0, 1, 0, 0, 0, 0, 0, 0], bool)
  # b = 2 images robust only under the stronger attack, c = 1 the reverse.
  result = sanity.paired_excess(stronger, weaker, z=0.5, min_points=1.0)
  assert (result["b"], result["c"]) == (2, 1)
  assert result["excess_points"] == pytest.approx(10.0)
  assert result["tolerance_points"] == pytest.approx(100 * 0.5 * 3**0.5 / 10)
  assert result["flagged"]
  assert not sanity.paired_excess(stronger, weaker, z=2.0)["flagged"]
  assert not sanity.paired_excess(weaker, stronger, z=0.0)["flagged"]


@pytest.mark.slow
def test_sanity_report_passes_a_normal_model():
  params, batches = _batches()
  report = sanity.sanity_checks(tiny_models.relu_mlp, params, batches,
                                jax.random.key(0), **_OPTIONS)
  assert report.passed, report.format()
  assert sanity.BANNER not in report.format()
  by_name = {c.name: c for c in report.checks}
  assert by_name["more_eot"].passed is None  # deterministic: skipped
  assert by_name["sweep_reaches_zero"].details["accuracy"] <= 2.0
  assert report.to_dict()["warning"] is None


@pytest.mark.parametrize("front_end", ["stop_gradient", "quantise"])
@pytest.mark.slow
def test_sanity_report_flags_a_masked_gradient(front_end):
  params, batches = _batches()

  def masked(params, images, key):
    if front_end == "stop_gradient":
      images = jax.lax.stop_gradient(images)
    else:  # rounding has a zero gradient almost everywhere
      images = jnp.round(images * 4) / 4
    return tiny_models.relu_mlp(params, images, key)

  report = sanity.sanity_checks(masked, params, batches, jax.random.key(0),
                                **_OPTIONS)
  assert not report.passed
  # White-box PGD cannot move, so the sweep stays high and NAttack wins.
  assert {"sweep_reaches_zero", "blackbox_weaker"} <= set(report.failed)
  text = report.format()
  assert text.startswith(sanity.BANNER) and text.endswith(sanity.BANNER)
  assert "[FAIL] blackbox_weaker" in text
  assert report.to_dict()["warning"] == sanity.BANNER


def test_detectable_points_by_hand():
  # z = 2: b images one way and none the other fail once b > 4.
  assert sanity.detectable_points(100) == pytest.approx(5.0)
  assert sanity.detectable_points(500) == pytest.approx(1.0)
  assert sanity.detectable_points(1000) == pytest.approx(1.0)  # min_points
  stronger = np.zeros(100, bool)
  stronger[:5] = True
  assert sanity.paired_excess(stronger, np.zeros(100, bool))["flagged"]
  stronger[4] = False
  assert not sanity.paired_excess(stronger, np.zeros(100, bool))["flagged"]


def _two_step_model(params, images, key):
  """Class 1 wins only once pixel 1 moves, and pixel 1's gradient is zero
  until pixel 0 has moved: one APGD iteration cannot break it, two can."""
  del params, key
  x0, x1 = images[:, 0, 0, 0], images[:, 0, 0, 1]
  gate = jax.nn.relu(x0 - 0.55)
  other = 0.01 * x0 + 100.0 * gate * (x1 - 0.5)
  return jnp.stack([jnp.full_like(x0, 0.1), other], axis=-1)


@pytest.mark.slow
def test_apgd_converged_fails_when_the_reported_budget_is_too_small():
  images = np.full((100, 1, 1, 2), 0.5, np.float32)
  batches = [{"image": images, "label": np.zeros(100, np.int32)}]
  options = dict(_OPTIONS, epsilon=0.1, sweep_epsilons=(0.0, 0.1))
  report = sanity.sanity_checks(_two_step_model, {}, batches,
                                jax.random.key(0),
                                **{**options, "apgd_budget": (1, 1)})
  assert "apgd_converged" in report.failed, report.format()
  check = next(c for c in report.checks if c.name == "apgd_converged")
  assert check.details["detectable_points"] == pytest.approx(5.0)
  assert "can fail from 5.0 points" in check.summary
  # Enough iterations: the same check passes.
  report = sanity.sanity_checks(_two_step_model, {}, batches,
                                jax.random.key(0), **options)
  assert "apgd_converged" not in report.failed, report.format()
