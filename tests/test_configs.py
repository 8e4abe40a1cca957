"""The configs: the paper's protocol and the table-row presets."""
import pytest

from configs import cpu, default, tiny


def test_default_is_the_papers_protocol():
  c = default.get_config()
  assert (c.model.depth, c.model.ensemble_size, c.model.noise_coef) == (
      20, 2, 0.1)
  assert c.training.num_epochs == 200 and c.training.batch_size == 128
  assert tuple(c.training.lr_boundaries) == (80, 120, 160)
  assert (c.training.learning_rate, c.training.momentum,
          c.training.weight_decay) == (0.1, 0.9, 5e-4)
  assert c.training.nesterov and c.training.adversarial
  assert (c.attack.num_steps, c.attack.random_start) == (10, True)
  assert c.attack.epsilon == pytest.approx(8 / 255)
  assert c.attack.step_size == pytest.approx(2 / 255)
  assert c.dataset.val_size == 5000


@pytest.mark.parametrize("presets,expected", [
    ("resnet20", dict(depth=20, ensemble_size=1, noise_coef=0.0)),
    ("resnet38", dict(depth=38, ensemble_size=1, noise_coef=0.0)),
    ("en5resnet20", dict(depth=20, ensemble_size=5, noise_coef=0.1)),
    ("en2resnet20,noskip", dict(depth=20, ensemble_size=2, skip=False)),
])
def test_model_presets(presets, expected):
  model = default.get_config(presets).model
  assert {k: model[k] for k in expected} == expected


def test_other_presets_and_composition():
  c = default.get_config("en5resnet20,rgsm,cifar100,natural")
  assert c.sparsity.method == "rgsm" and c.sparsity.beta == 1.0
  assert c.dataset.name == "cifar100" and not c.training.adversarial
  # presets compose with the small configs too
  c = cpu.get_config("resnet20,rvsm")
  assert (c.model.depth, c.sparsity.method) == (20, "rvsm")
  assert tiny.get_config().dataset.source == "synthetic"


def test_unknown_preset_is_rejected():
  with pytest.raises(ValueError, match="unknown config preset 'resnet21x'"):
    default.get_config("resnet21x")


def test_member_execution_auto_depends_on_backend_and_size():
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax import experiment  # pylint: disable=import-outside-toplevel
  on_cpu = jax.default_backend() == "cpu"
  config = default.get_config()
  assert config.model.member_execution == "auto"
  assert experiment.member_execution(config) == (
      "unrolled" if on_cpu else "batched")
  config.model.ensemble_size = experiment.MAX_UNROLLED_MEMBERS + 1
  assert experiment.member_execution(config) == (
      "sequential" if on_cpu else "batched")
  config.model.member_execution = "batched"
  assert experiment.member_execution(config) == "batched"


def test_a_batch_larger_than_the_training_set_is_a_clear_error():
  from fkjax import experiment  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.training.batch_size = 128  # the tiny training split has 64 images
  with pytest.raises(ValueError, match="exceeds the 64 training examples"):
    experiment.Experiment.build(config)
