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


def test_kernels_may_change_between_runs_of_a_workdir(tmp_path):
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  run_config.save(config, str(tmp_path))
  # How the model runs may change (e.g. trained on a GPU, resumed on a CPU)...
  config.kernels.conv = "xla"
  config.kernels.noise = "jnp"
  config.kernels.member_execution = "sequential"
  run_config.check_same_run(config, str(tmp_path))
  # ...what it computes may not.
  config.model.depth += 6
  with pytest.raises(ValueError, match="model.depth: saved 8, now 14"):
    run_config.check_same_run(config, str(tmp_path))


def test_describe_model_names_the_resolved_kernels():
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  config = default.get_config("en2resnet20")
  config.kernels.conv = "xla"
  config.kernels.noise = "jnp"
  state = {"params": {"w": jax.ShapeDtypeStruct((3, 4), "float32")}}
  text = build.describe_model(config, state)
  assert text.startswith("En2ResNet20 (noise 0.1, skip), 12 parameters")
  members = "unrolled" if jax.default_backend() == "cpu" else "batched"
  assert text.endswith(f"conv xla, noise jnp, members {members}")
  # A plain ResNet without noise: only its convolution.
  plain = default.get_config("resnet20")
  plain.kernels.conv = "xla"
  assert build.describe_model(plain, state).endswith(
      "sparsifier none; conv xla")


def test_a_batch_larger_than_the_training_set_is_a_clear_error():
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.training.batch_size = 128  # the tiny training split has 64 images
  with pytest.raises(ValueError, match="exceeds the 64 training examples"):
    build.Experiment.build(config)


def test_a_key_set_in_two_sections_is_an_error():
  assert default.merged({"a.b": 1}, {"a.c": 2}) == {"a.b": 1, "a.c": 2}
  with pytest.raises(ValueError, match="config keys set twice: a.b"):
    default.merged({"a.b": 1, "x": 0}, {"a.b": 2})


def test_no_config_file_writes_a_key_twice():
  # A dict literal keeps the last of two equal keys without a word; the
  # sections are merged by default.merged, which refuses an overlap.
  import ast  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  files = sorted(pathlib.Path(default.__file__).parent.glob("*.py"))
  assert len(files) >= 4
  for path in files:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      if isinstance(node, ast.Dict):
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        assert len(keys) == len(set(keys)), (path.name, keys)
      # Values are data: no config.a.b = ... statements.
      assert not (isinstance(node, ast.Assign) and any(
          isinstance(t, ast.Attribute) for t in node.targets)), (
              path.name, ast.unparse(node))
  assert set(default.DEFAULTS) == set(default.merged(
      default.RUN, default.DATASET, default.MODEL, default.KERNELS,
      default.TRAINING, default.ATTACK, default.SPARSITY, default.VALIDATION,
      default.EVAL, default.ENVIRONMENT))


def test_presets_set_only_keys_the_config_has():
  config = default.get_config()
  with pytest.raises(KeyError, match="config has no key 'model.dpth'"):
    default.set_values(config, {"model.dpth": 8})
  for name, values in default.PRESETS.items():
    default.set_values(default.get_config(), values)   # every key exists
    assert default.get_config(name).to_dict() != default.get_config(
        ).to_dict() or name in ("none", "cifar10"), name


def test_optional_values_are_not_shared_between_configs():
  a, b = default.get_config(), default.get_config()
  a.eval.nattack_chunk = 3
  a.training.data_seed = 7
  assert b.eval.nattack_chunk == 0 and b.training.data_seed is None
  b.eval.nattack_chunk = None    # a placeholder: None is allowed
  assert default.get_config().eval.nattack_chunk == 0
