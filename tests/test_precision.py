"""config.precision: float32 (HIGHEST), tf32 (HIGH) and bfloat16, explicit.

Each precision runs one step of a tiny model here, and its step is lowered
for CUDA (no compile) to check what a GPU gets: the precision written into
every matmul and convolution, and the dtypes they compute in.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from fkjax import data
from fkjax import kernels
from fkjax.config import record as run_config
from fkjax.training import build
from fkjax.training import input_pipeline
from fkjax.training import precision
from fkjax.training import step as step_lib
from tests import hlo

PRECISIONS = ("float32", "tf32", "bfloat16")


def _config(name):
  config = tiny.get_config()
  config.num_devices = 1
  config.attack.num_steps = 1
  config.precision = name
  return config


@pytest.fixture(scope="module")
def steps():
  """One step from the same state, batch and key in float32 and bfloat16,
  and each precision's step lowered for CUDA with a GPU's kernels."""
  exp = build.Experiment.build(_config("float32"))
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  key = jax.random.key(1)
  out = {"initial": jax.device_get(exp.initial_state())}
  for name in ("float32", "bfloat16"):
    step = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer,
                                         _config(name)))
    out[name] = jax.device_get(step(exp.initial_state(), batch, key))
    out[name + "_jaxpr"] = jax.make_jaxpr(step)(out["initial"], batch, key)
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(kernels.PLATFORM_ENV, "gpu")
    gpu_model = build.create_model(_config("float32"),
                                        exp.dataset.num_classes)
  for name in PRECISIONS:
    step = jax.jit(step_lib.make_train_step(gpu_model, exp.optimizer,
                                         _config(name)))
    out[name + "_cuda"] = step.trace(out["initial"], batch, key).lower(
        lowering_platforms=("cuda",))
  return out


def _ops(lowered, op):
  """The ``op`` operations (``convolution``, ``dot_general``) of a lowered
  program."""
  return hlo.stablehlo_ops(lowered, op)


def _precisions(op):
  """The precisions an operation asks of its operands (none: DEFAULT)."""
  if "precision_config" not in op.attributes:
    return {"DEFAULT"}
  return {re.search(r"precision (\w+)>", str(p)).group(1)
          for p in op.attributes["precision_config"]}


def _types(values):
  return {str(v.type.element_type) for v in values}


@pytest.mark.parametrize("name,want", [("float32", "HIGHEST"),
                                       ("tf32", "HIGH")])
def test_every_matmul_and_convolution_of_the_step_names_its_precision(
    steps, name, want):
  # The forward and backward passes of the attack and of the update alike:
  # not JAX's default (TF32 on Ampere/Hopper, whatever the log said).
  convs = _ops(steps[name + "_cuda"], "convolution")
  dots = _ops(steps[name + "_cuda"], "dot_general")
  assert len(convs) > 20 and dots
  for op in convs + dots:
    assert _precisions(op) == {want}, op
    assert "bf16" not in _types([*op.operands, *op.results]), op


def test_bfloat16_convolutions_compute_in_bfloat16_for_cuda(steps):
  convs = _ops(steps["bfloat16_cuda"], "convolution")
  assert len(convs) > 20
  assert all(_types(op.results) == {"bf16"} for op in convs)
  assert "bf16" not in hlo.element_types(steps["float32_cuda"])


def test_state_and_loss_stay_float32(steps):
  state, metrics = steps["bfloat16"]
  for part in ("params", "batch_stats", "opt_state"):
    dtypes = {x.dtype for x in jax.tree.leaves(state[part])
              if jnp.issubdtype(x.dtype, jnp.floating)}
    assert dtypes == {np.dtype(np.float32)}, part
  assert metrics["loss"].dtype == np.float32


def test_the_convolutions_compute_in_bfloat16(steps):
  def dtypes(eqn):
    return {str(getattr(v.aval, "dtype", None)) for v in eqn.outvars}
  bf16 = [eqn for eqn in hlo.equations(steps["bfloat16_jaxpr"])
          if eqn.primitive.name == "conv_general_dilated"]
  assert len(bf16) > 10
  assert all(dtypes(eqn) == {"bfloat16"} for eqn in bf16)
  assert not any("bfloat16" in dtypes(eqn)
                 for eqn in hlo.equations(steps["float32_jaxpr"]))


def test_tf32_differs_from_float32_only_in_the_precision_it_asks(steps):
  # The same program but for the precision of its matmuls and convolutions
  # (XLA:CPU computes float32 at either; a GPU with TF32 does not).
  f32, tf32 = steps["float32_cuda"].as_text(), steps["tf32_cuda"].as_text()
  assert f32 != tf32
  assert f32.replace("HIGHEST", "HIGH") == tf32


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


def test_validation_and_evaluation_are_true_float32_whatever_the_setting(
    monkeypatch):
  # The model a run builds (validation and eval.py apply it) is HIGHEST
  # float32 even where the training steps take bfloat16 or tf32; the
  # tests' own global default (conftest) is lowered over, not relied on.
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")
  config = _config("bfloat16")
  model = build.create_model(config, 10)
  eval_apply, _ = build.model_fns(model)
  variables = jax.eval_shape(model.init, jax.random.key(0),
                             jnp.zeros((2, 32, 32, 3)))
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with jax.default_matmul_precision("default"):
    lowered = jax.jit(eval_apply).trace(variables, images, key).lower(
        lowering_platforms=("cuda",))
  ops = _ops(lowered, "convolution") + _ops(lowered, "dot_general")
  assert len(ops) > 5
  assert all(_precisions(op) == {"HIGHEST"} for op in ops)
  assert "bf16" not in hlo.element_types(lowered)
  # The training model of a record without config.precision is float32.
  del config.precision
  assert precision.training_model(model, config).name == "float32"


def test_precision_is_validated_and_logged():
  config = _config("float16")
  with pytest.raises(run_config.ConfigError,
                     match=r"config.precision='float16' is invalid: one of"):
    run_config.validate(config)
  for name in PRECISIONS:
    run_config.validate(_config(name))
  assert input_pipeline.describe("device", _config("bfloat16")) == (
      "data pipeline device, precision bfloat16 "
      "(bfloat16 compute; float32 weights, optimizer, statistics and loss)")
  assert input_pipeline.describe("host", _config("float32")) == (
      "data pipeline host, precision float32 (matmuls "
      "and convolutions at HIGHEST)")
  assert "tf32" in input_pipeline.describe("host", _config("tf32"))
