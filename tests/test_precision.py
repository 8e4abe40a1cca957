"""config.precision="bfloat16": bf16 compute, float32 state and loss."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from fkjax import data
from fkjax.training import input_pipeline
from fkjax.training import build
from fkjax.config import record as run_config
from fkjax.training import step as step_lib


def _config(precision):
  config = tiny.get_config()
  config.num_devices = 1
  config.attack.num_steps = 1
  config.precision = precision
  return config


@pytest.fixture(scope="module")
def steps():
  """One step from the same state, batch and key in each precision."""
  exp = build.Experiment.build(_config("float32"))
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  key = jax.random.key(1)
  out = {"initial": jax.device_get(exp.initial_state())}
  for name in ("float32", "bfloat16"):
    step = step_lib.make_train_step(exp.model, exp.optimizer, _config(name))
    out[name] = jax.device_get(jax.jit(step)(exp.initial_state(), batch,
                                             key))
    out[name + "_jaxpr"] = str(jax.make_jaxpr(step)(out["initial"], batch,
                                                    key))
  return out


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
  # (float32 convolutions on CPU are oneDNN's custom calls, bfloat16 ones
  # XLA's: fkjax.kernels.onednn_conv)
  bf16 = convs(steps["bfloat16_jaxpr"])
  assert len(bf16) > 10
  assert all("bf16[" in line.split("=")[0] for line in bf16)
  assert "bf16[" not in steps["float32_jaxpr"]


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


def test_precision_is_validated_and_logged():
  config = _config("float16")
  with pytest.raises(run_config.ConfigError,
                     match=r"config.precision='float16' is invalid: one of"):
    run_config.validate(config)
  assert input_pipeline.describe("device", _config("bfloat16")) == (
      "data pipeline device, precision bfloat16")
