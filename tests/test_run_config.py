"""A run's config: validation, the resume check and eval.py's config."""
import json
import os

import pytest

from configs import cpu, default, tiny
from fkjax.training import build
from fkjax.training import devices
from fkjax.config import record as run_config
from fkjax.config.record import ConfigError


@pytest.mark.parametrize("module", [default, cpu, tiny])
def test_shipped_configs_are_valid(module):
  run_config.validate(module.get_config())
  for preset in ("resnet20,rvsm", "en5resnet20,rgsm", "resnet38,admm,noskip",
                 "cifar100,natural"):
    run_config.validate(module.get_config(preset))


@pytest.mark.parametrize("key,value,match", [
    ("training.num_epochs", 0, "integer >= 1"),
    ("training.num_epochs", -3, "integer >= 1"),
    ("training.batch_size", 0, "integer >= 1"),
    ("model.depth", 21, "6n.2"),
    ("model.depth", 2, "6n.2"),
    ("attack.epsilon", 8.0, r"8/255"),
    ("attack.epsilon", 2.0, r"\(0, 1\]"),
    ("attack.epsilon", 0.0, r"\(0, 1\]"),
    ("attack.step_size", -0.1, "number"),
    ("training.learning_rate", 0.0, "number"),
    ("training.lr_boundaries", (120, 80), "increasing"),
    ("training.momentum", 1.0, "number"),
    ("training.weight_decay", -1e-4, "number"),
    ("model.noise_coef", -0.1, "number"),
    ("validation.select_by", "best", "one of"),
    ("eval.checkpoint", "last", "one of"),
    ("eval.protocol", "a5/../x", "eval_<name>.json"),
    ("eval.protocol", "", "eval_<name>.json"),
    ("eval.protocol", "strng", "too close to 'strong'"),
    ("eval.protocol", "Strong", "too close to 'strong'"),
    ("eval.protocol", "Paper", "too close to 'paper'"),
    ("eval.eot_samples", 0, "integer >= 1"),
    ("eval.attacks", "natural,pgd7", "unknown attack"),
    ("dataset.name", "cifar11", "one of"),
    ("training.data_pipeline", "gpu", "one of"),
    ("training.steps_per_dispatch", -1, "integer >= 0"),
    ("training.steps_per_dispatch", 2.5, "integer >= 0"),
])
def test_invalid_values_are_named(key, value, match):
  config = tiny.get_config()
  section, name = key.split(".")
  with config[section].ignore_type():
    config[section][name] = value
  with pytest.raises(ConfigError, match=f"config.{key}=") as e:
    run_config.validate(config)
  assert e.match(match)


@pytest.mark.parametrize("method,key,value", [
    ("rvsm", "beta", 0.0), ("rvsm", "lamb", -1e-6),
    ("rgsm", "beta", -1.0), ("rgsm", "lamb1", -5e-2), ("rgsm", "lamb2", -1.0),
    ("admm", "rho", 0.0), ("admm", "percent", 120.0),
    ("admm", "structure", "filter"), ("rgsm", "group", "both"),
])
def test_invalid_sparsifier_hyperparameters(method, key, value):
  config = default.get_config(method)
  with config.sparsity.ignore_type():
    config.sparsity[key] = value
  with pytest.raises(ConfigError, match="config.sparsity") as e:
    run_config.validate(config)
  assert key in str(e.value) or repr(value) in str(e.value)


def test_a_named_protocol_is_a_further_paper_evaluation(tmp_path):
  from fkjax import workdir
  config = default.get_config()
  config.eval.protocol = "a5"
  run_config.validate(config)
  for name in ("natural100", "latest", "strong", "paper"):
    config.eval.protocol = name
    run_config.validate(config)
  config.eval.protocol = "a5"
  assert workdir.eval_result_path(str(tmp_path), config) == str(
      tmp_path / "eval_a5.json")


def test_build_validates_before_loading_data():
  config = default.get_config()   # real data: would need FKJAX_DATA_DIR
  config.dataset.data_dir = "/nonexistent/data"
  config.model.depth = 21
  with pytest.raises(ConfigError, match="model.depth"):
    build.Experiment.build(config)


def test_resume_refuses_a_changed_training_section(tmp_path):
  config = tiny.get_config()
  run_config.save(config, str(tmp_path))
  same = tiny.get_config()
  same.eval.attacks = "natural"          # how it is evaluated may change
  same.num_devices = 4                   # and where it runs
  run_config.check_same_run(same, str(tmp_path))
  changed = tiny.get_config()
  changed.training.batch_size = 8
  with pytest.raises(ConfigError, match=r"training.batch_size: saved 16, "
                     r"now 8"):
    run_config.check_same_run(changed, str(tmp_path))


def test_eval_config_comes_from_the_workdir(tmp_path):
  trained = tiny.get_config()
  trained.sparsity.lamb = 5e-3
  run_config.save(trained, str(tmp_path))
  cli = default.get_config()   # eval.py's default file, not the run's
  config = run_config.config_for_eval(
      str(tmp_path), cli, {"eval.attacks": "natural"}, config_given=False)
  assert config.sparsity.lamb == 5e-3
  assert config.model.depth == 8 and config.dataset.source == "synthetic"
  assert config.eval.attacks == "natural"
  # the run's own eval settings, unless overridden
  assert config.eval.batch_size == trained.eval.batch_size


def test_eval_refuses_overrides_that_change_the_run(tmp_path):
  run_config.save(tiny.get_config(), str(tmp_path))
  with pytest.raises(ConfigError, match=r"--config.sparsity.lamb1=0.1 would "
                     "change what the run"):
    run_config.config_for_eval(str(tmp_path), default.get_config(),
                               {"sparsity.lamb1": 0.1}, config_given=False)
  other = tiny.get_config("rgsm")
  with pytest.raises(ConfigError, match="sparsity.method: run 'rvsm', "
                     "--config 'rgsm'"):
    run_config.config_for_eval(str(tmp_path), other, {}, config_given=True)
  with pytest.raises(ConfigError, match="no config.json"):
    run_config.config_for_eval(str(tmp_path / "nowhere"), None, {}, False)


@pytest.mark.parametrize("recorded", ["float32", "tf32", None])
def test_a_config_file_leaving_the_precision_to_the_platform_is_the_run(
    tmp_path, recorded):
  # A run records the precision "auto" took (float32 on a CPU, tf32 on a
  # GPU; none before the key existed): the config file it came from, with
  # "auto", describes it to eval.py; one asking another precision does not.
  trained = tiny.get_config()
  if recorded is None:
    del trained.precision
  else:
    trained.precision = recorded
  run_config.save(trained, str(tmp_path))
  cli = tiny.get_config()
  assert cli.precision == "auto"
  config = run_config.config_for_eval(str(tmp_path), cli, {},
                                      config_given=True)
  assert config.precision == (recorded or "float32")
  cli.precision = "bfloat16"
  with pytest.raises(ConfigError, match="precision"):
    run_config.config_for_eval(str(tmp_path), cli, {}, config_given=True)


def test_saved_config_is_plain_json(tmp_path):
  run_config.save(tiny.get_config(), str(tmp_path))
  data = json.loads((tmp_path / "config.json").read_text())
  assert data["model"]["depth"] == 8
  assert not list(tmp_path.glob(".config.*"))   # no temporary file left


def test_a_failed_save_keeps_the_previous_config_and_no_temporary(
    tmp_path, monkeypatch):
  run_config.save(tiny.get_config(), str(tmp_path))
  before = (tmp_path / "config.json").read_bytes()

  def full_disk(src, dst):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "replace", full_disk)
  with pytest.raises(OSError):
    run_config.save(cpu.get_config(), str(tmp_path))
  assert (tmp_path / "config.json").read_bytes() == before
  assert os.listdir(tmp_path) == ["config.json"]


def test_prng_streams_are_distinct_and_seed_specific():
  import jax  # pylint: disable=import-outside-toplevel
  keys = {(seed, s): tuple(jax.random.key_data(
      build.prng_key(seed, s)).tolist())
          for seed in (0, 1) for s in build.STREAMS}
  assert len(set(keys.values())) == len(keys)
  with pytest.raises(ValueError, match="unknown PRNG stream"):
    build.prng_key(0, "dropout")


def test_unwritable_compilation_cache_warns_and_runs_on(tmp_path, monkeypatch):
  import jax  # pylint: disable=import-outside-toplevel
  if jax.config.jax_compilation_cache_dir:
    pytest.skip("a compilation cache is configured for this process")
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder")
  config = tiny.get_config()
  config.compilation_cache_dir = str(blocker / "cache")
  with pytest.warns(RuntimeWarning, match="compilation cache disabled"):
    assert devices.enable_compilation_cache(config) is None


def test_a_run_resumes_with_other_speed_settings_not_another_precision(
    tmp_path):
  saved = tiny.get_config()
  saved.precision = "float32"   # as a CPU run records "auto"
  run_config.save(saved, str(tmp_path))
  other = saved.copy_and_resolve_references()
  other.training.data_pipeline = "device"
  other.training.steps_per_dispatch = 8
  run_config.check_same_run(other, str(tmp_path))   # only speed changed
  other.precision = "bfloat16"
  with pytest.raises(ConfigError, match="config.precision: saved 'float32'"):
    run_config.check_same_run(other, str(tmp_path))


def test_allowed_names_come_from_the_modules_that_use_them(monkeypatch):
  # One list: a pipeline (or data source) the code gains is valid at once.
  from fkjax.training import input_pipeline  # pylint: disable=import-outside-toplevel
  from fkjax.data import sources  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.training.data_pipeline = "sharded"
  with pytest.raises(ConfigError, match="one of"):
    run_config.validate(config)
  monkeypatch.setattr(input_pipeline, "PIPELINES",
                      (*input_pipeline.PIPELINES, "sharded"))
  run_config.validate(config)
  monkeypatch.setattr(sources, "SOURCES", ("synthetic",))
  config.dataset.source = "tfds"
  with pytest.raises(ConfigError, match=r"dataset.source='tfds'.*\['synthetic'\]"):
    run_config.validate(config)


def test_every_key_has_one_rule():
  from fkjax.config import schema as config_schema  # pylint: disable=import-outside-toplevel
  keys = [key for key, _ in config_schema.rules(("natural",))]
  twice = sorted({k for k in keys if keys.count(k) > 1})
  # The one relation checked after its own key's values: PGD selection needs
  # the validation attack.
  assert twice == ["validation.select_by"]
  flat = run_config.flatten(run_config.as_dict(default.get_config()))
  unknown = [k for k in keys if k not in flat and not any(
      f.startswith(k + ".") for f in flat)]
  assert not unknown


def test_a_mistake_outside_the_jax_named_keys_is_said_before_jax_loads():
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from pathlib import Path  # pylint: disable=import-outside-toplevel
  script = (
      "import sys\n"
      "from configs import tiny\n"
      "from fkjax.config import record as run_config\n"
      "c = tiny.get_config(); c.attack.epsilon = 8.0\n"
      "try:\n"
      "  run_config.validate(c)\n"
      "except run_config.ConfigError as e:\n"
      "  print(str(e).split(' is invalid')[0], 'jax' in sys.modules)\n")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, cwd=Path(__file__).resolve().parents[1],
                        timeout=120)
  assert proc.stdout.split() == ["config.attack.epsilon=8.0", "False"], (
      proc.stderr)
