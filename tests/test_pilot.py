"""The cpu scale's calibration pilots: their configs are what the docs say."""
import pytest

from fkjax.reproduce import pilot
from fkjax.reproduce import scales


def _decay(config) -> float:
  """Summed lr x weight decay over the schedule: what shrinks a weight."""
  return scales.learning_rate_sum(config) * config.training.weight_decay


@pytest.mark.parametrize("name", sorted(pilot.PILOTS))
def test_every_pilot_builds_on_the_cpu_scale(name):
  config = pilot.pilot_config(name)
  cpu = scales.build_config("resnet20,none", {}, scales.SCALES["cpu"],
                            seed=0)
  assert config.dataset.name == cpu.dataset.name
  assert config.attack.num_steps == cpu.attack.num_steps
  assert "natural" in config.eval.final_attacks.split(",")


@pytest.mark.parametrize("name", ["rgsm_m4_x2", "at_m4_x2"])
def test_a_doubled_schedule_at_m4_has_the_scales_summed_decay(name):
  doubled = pilot.pilot_config(name)
  scale = scales.build_config(pilot.PILOTS[name]["presets"],
                              {"sparsity.lamb1": 0.1}
                              if "rgsm" in name else {},
                              scales.SCALES["cpu"], seed=0)
  t = doubled.training
  assert t.num_epochs == 2 * scale.training.num_epochs
  assert tuple(t.lr_boundaries) == tuple(
      2 * b for b in scale.training.lr_boundaries)
  # half the scale's weight decay (m = 4, not 8) over twice the steps
  assert t.weight_decay == pytest.approx(scale.training.weight_decay / 2)
  assert _decay(doubled) == pytest.approx(_decay(scale), rel=1e-6)
  if "rgsm" in name:
    # thresholds x m^-1/4: lambda1 x m^-1/2, beta as in the paper
    assert doubled.sparsity.lamb1 == pytest.approx(0.1 / 2)
    assert doubled.sparsity.beta == scale.sparsity.beta
