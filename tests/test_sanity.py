"""Tests for fkjax.sanity: the report flags masked gradients, not models."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import sanity
from tests import tiny_models

# A short sweep and small attacks keep the test fast; the checks are the
# same as with the defaults.
_OPTIONS = dict(sweep_epsilons=(0.0, 8 / 255, 64 / 255), steps=(10, 40),
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
