"""config.precision: auto (the default), float32 (HIGHEST), tf32 (HIGH)
and bfloat16, explicit.

Each precision runs one step of a tiny model here, and its step is traced
once with an accelerator's selections and lowered (no compile) for CUDA and
for TPU to check what a GPU and a TPU get: the precision written into every
matmul and convolution (read from the StableHLO operations' attributes), and
the dtypes they compute in.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import conv_forms
from configs import tiny
from fkjax import data
from fkjax import kernels
from fkjax.config import record as run_config
from fkjax.training import build
from fkjax.training import input_pipeline
from fkjax.training import precision
from fkjax.training import step as step_lib

PRECISIONS = ("float32", "tf32", "bfloat16")
# Lowered for -> the selections (FKJAX_KERNELS_PLATFORM) a run there takes.
PLATFORMS = {"cuda": "gpu", "tpu": "tpu"}


def _config(name):
  config = tiny.get_config()
  config.num_devices = 1
  config.attack.num_steps = 1
  config.precision = name
  return config


@pytest.fixture(scope="module")
def steps():
  """One step from the same state, batch and key in float32 and bfloat16;
  each precision's step (and the default's) traced once with an
  accelerator's kernels and lowered for CUDA and for TPU; the default's
  clean step lowered for the CPU with XLA's convolutions."""
  exp = build.Experiment.build(_config("float32"))
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  key = jax.random.key(1)
  out = {"initial": jax.device_get(exp.initial_state())}
  for name in ("float32", "bfloat16"):
    step = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer,
                                            _config(name)))
    out[name] = jax.device_get(step(exp.initial_state(), batch, key))
    out[name + "_jaxpr"] = str(jax.make_jaxpr(step)(out["initial"], batch,
                                                    key))
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(kernels.PLATFORM_ENV, "gpu")
    # A TPU's selections are a GPU's: one trace serves both lowerings.
    assert (kernels.resolve(backend="tpu").model_kwargs
            == kernels.resolve(backend="gpu").model_kwargs)
    assert precision.AUTO["tpu"] == precision.AUTO["gpu"]
    gpu_model = build.create_model(_config("float32"),
                                   exp.dataset.num_classes)
    for name in ("auto", *PRECISIONS):
      traced = jax.jit(step_lib.make_train_step(
          gpu_model, exp.optimizer, _config(name))).trace(
              out["initial"], batch, key)
      for platform in PLATFORMS:
        out[name, platform] = traced.lower(lowering_platforms=(platform,))
  cpu_config = _config("auto")
  cpu_config.kernels.conv = "xla"   # convolutions as ops, not oneDNN calls
  cpu_config.training.adversarial = False   # the update's passes suffice
  out["auto", "cpu"] = jax.jit(step_lib.make_train_step(
      build.create_model(cpu_config, exp.dataset.num_classes),
      exp.optimizer, cpu_config)).trace(out["initial"], batch, key).lower(
          lowering_platforms=("cpu",))
  return out


def _products(lowered):
  """Every convolution's and matmul's ``(precision, result dtype)``."""
  convs = [(c.precision, c.dtype) for c in conv_forms.convolutions(lowered)]
  dots = [(conv_forms.precision_of(op), conv_forms.result_dtype(op))
          for op in conv_forms.operations(lowered, "stablehlo.dot_general")]
  return convs, dots


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name,want", [("float32", "HIGHEST"),
                                       ("tf32", "HIGH"), ("auto", "HIGH")])
def test_every_matmul_and_convolution_of_the_step_names_its_precision(
    steps, platform, name, want):
  # The forward and backward passes of the attack and of the update alike:
  # not JAX's default (TF32 on Ampere/Hopper, one bfloat16 pass on TPUs,
  # whatever the log said). The default, on an accelerator, is tf32.
  convs, dots = _products(steps[name, platform])
  assert len(convs) > 20 and dots
  for want_precision, dtype in convs + dots:
    assert set(want_precision) == {want}
    assert dtype == "f32"


def test_the_default_on_a_cpu_is_true_float32(steps):
  convs, dots = _products(steps["auto", "cpu"])
  assert len(convs) > 10 and dots
  assert {p for c in convs + dots for p in c[0]} == {"HIGHEST"}
  with pytest.MonkeyPatch.context() as patch:
    patch.delenv(kernels.PLATFORM_ENV, raising=False)
    assert precision.name_of(_config("auto")) == "float32"
    for family in ("gpu", "tpu"):
      patch.setenv(kernels.PLATFORM_ENV, family)
      assert precision.name_of(_config("auto")) == "tf32"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_bfloat16_convolutions_compute_in_bfloat16(steps, platform):
  convs = conv_forms.convolutions(steps["bfloat16", platform])
  assert len(convs) > 20
  assert all(c.dtype == "bf16" for c in convs)
  assert all(c.dtype == "f32"
             for c in conv_forms.convolutions(steps["float32", platform]))


def test_state_and_loss_stay_float32(steps):
  state, metrics = steps["bfloat16"]
  for part in ("params", "batch_stats", "opt_state"):
    dtypes = {x.dtype for x in jax.tree.leaves(state[part])
              if jnp.issubdtype(x.dtype, jnp.floating)}
    assert dtypes == {np.dtype(np.float32)}, part
  assert metrics["loss"].dtype == np.float32


def test_the_convolutions_compute_in_bfloat16(steps):
  def convs(text):
    return [line for line in text.splitlines()
            if "conv_general_dilated[" in line]
  bf16 = convs(steps["bfloat16_jaxpr"])
  assert len(bf16) > 10
  assert all("bf16[" in line.split("=")[0] for line in bf16)
  assert "bf16[" not in steps["float32_jaxpr"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_tf32_differs_from_float32_only_in_the_precision_it_asks(
    steps, platform):
  # The same program but for the precision of its matmuls and convolutions
  # (XLA:CPU computes float32 at either; a GPU with TF32 does not); the
  # default on an accelerator is tf32's program.
  f32, tf32, auto = (steps[name, platform].as_text()
                     for name in ("float32", "tf32", "auto"))
  assert f32 != tf32
  assert f32.replace("HIGHEST", "HIGH") == tf32
  assert auto == tf32


def test_a_bfloat16_step_is_close_to_the_float32_one_not_equal(steps):
  (s32, m32), (s16, m16) = steps["float32"], steps["bfloat16"]
  assert m16["loss"] != m32["loss"]
  np.testing.assert_allclose(m16["loss"], m32["loss"], rtol=2e-2)
  before = np.concatenate([np.ravel(x) for x in jax.tree.leaves(
      steps["initial"]["params"])])
  after = [np.concatenate([np.ravel(x) for x in jax.tree.leaves(s["params"])])
           for s in (s32, s16)]
  update32, update16 = after[0] - before, after[1] - before
  assert not np.array_equal(update16, update32)
  cosine = update16 @ update32 / (np.linalg.norm(update16) *
                                  np.linalg.norm(update32))
  assert cosine > 0.95, cosine


@pytest.mark.parametrize("platform", PLATFORMS)
def test_validation_and_evaluation_are_true_float32_whatever_the_setting(
    monkeypatch, platform):
  # The model a run builds (validation and eval.py apply it) is HIGHEST
  # float32 even where the training steps take bfloat16 or tf32; the
  # tests' own global default (conftest) is lowered over, not relied on.
  monkeypatch.setenv(kernels.PLATFORM_ENV, PLATFORMS[platform])
  config = _config("bfloat16")
  model = build.create_model(config, 10)
  eval_apply, _ = build.model_fns(model)
  variables = jax.eval_shape(model.init, jax.random.key(0),
                             jnp.zeros((2, 32, 32, 3)))
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with jax.default_matmul_precision("default"):
    lowered = jax.jit(eval_apply).trace(variables, images, key).lower(
        lowering_platforms=(platform,))
  convs, dots = _products(lowered)
  assert len(convs) > 5 and dots
  assert {p for c in convs + dots for p in c[0]} == {"HIGHEST"}
  assert {dtype for _, dtype in convs + dots} == {"f32"}
  # The training model of a record without config.precision is float32.
  del config.precision
  assert precision.training_model(model, config).name == "float32"


def test_precision_is_validated_and_logged(monkeypatch):
  config = _config("float16")
  with pytest.raises(run_config.ConfigError,
                     match=r"config.precision='float16' is invalid: one of"):
    run_config.validate(config)
  for name in ("auto", *PRECISIONS):
    run_config.validate(_config(name))
  assert input_pipeline.describe("device", _config("bfloat16")) == (
      "data pipeline device, precision bfloat16 "
      "(bfloat16 compute; float32 weights, optimizer, statistics and loss)")
  assert input_pipeline.describe("host", _config("float32")).startswith(
      "data pipeline host, precision float32 (matmuls and convolutions at "
      "HIGHEST")
  # The log names the precision "auto" took, and float32 beside it.
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")
  line = input_pipeline.describe("host", _config("auto"))
  assert line.startswith("data pipeline host, precision tf32 (")
  assert "precision=float32" in line


def test_a_run_records_the_precision_auto_took(monkeypatch):
  config = _config("auto")
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")
  assert precision.resolved(config).precision == "tf32"
  assert config.precision == "auto"   # a copy
  monkeypatch.delenv(kernels.PLATFORM_ENV)
  assert precision.resolved(config).precision == "float32"
  explicit = _config("bfloat16")
  assert precision.resolved(explicit) is explicit
  # What "auto" may become, as the records' check reads it without JAX.
  assert set(precision.AUTO.values()) == set(run_config.AUTO_PRECISIONS)
