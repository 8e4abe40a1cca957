"""The GPU path, checked on a CPU: fkjax's programs lowered for CUDA.

With a GPU's selections forced (``FKJAX_KERNELS_PLATFORM=gpu``) the training
step (a single net, an ensemble, a sweep over a run axis), the validation and
the strong protocol's attacks (and APGD called alone) are traced and lowered
for CUDA (no compile), and their StableHLO says what a GPU would get: the
stock convolutions, JAX's Threefry for the noise, no CPU custom call, no
host callback. One test
trains and resumes through ``train.py`` with those selections (the slow
set's).
"""
import functools
import re
import signal
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from fkjax import attacks
from fkjax import data
from fkjax import kernels
from fkjax import checkpoint as ckpt_lib
from fkjax.attacks import population_chunk
from fkjax.evaluation import suites
from fkjax.training import build
from fkjax.training import program
from fkjax.training import step as step_lib
from fkjax.training import validation
from tests import hlo
from tests import tiny_models
from tests.test_train import REPO
from tests.test_train import _cmd
from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

# Custom calls a GPU program may hold: sharding annotations, not kernels.
_SHARDING_CALLS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"}


def _config(**values):
  config = tiny.get_config()
  config.num_devices = 1
  for key, value in values.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


def _gpu(monkeypatch):
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")


def _cuda(jitted, *args):
  """``jitted`` traced on ``args`` (shapes) and lowered for CUDA: the
  lowered program and its jaxpr's primitives."""
  traced = jitted.trace(*args)
  return traced.lower(lowering_platforms=("cuda",)), hlo.primitives(
      traced.jaxpr)


def _step_program(config):
  """A training step of ``config`` lowered for CUDA."""
  exp = build.Experiment.build(config)
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  state = jax.eval_shape(exp.initial_state)
  step = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer, config))
  return _cuda(step, state, batch, jax.random.key(0))


def _count(program, op):
  return hlo.operations(program)[f"stablehlo.{op}"]


def _convolutions(program):
  """``(window, feature_group_count, batch_group_count)`` of every
  convolution: the spatial size of its ``rhs``, and its groups."""
  out = []
  for op in hlo.stablehlo_ops(program, "convolution"):
    # #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>: the rhs's
    # axes between "x[" and "]".
    numbers = str(op.attributes["dimension_numbers"])
    dims = [d.strip() for d in re.search(r"\]x\[([^\]]*)\]",
                                         numbers).group(1).split(",")]
    rhs = op.operands[1].type.shape
    groups = [op.attributes[name].value
              for name in ("feature_group_count", "batch_group_count")]
    out.append((max(rhs[dims.index(d)] for d in ("0", "1")), *groups))
  return out


def _assert_gpu_program(program, primitives, noise=True):
  """What a GPU gets: no CPU kernel, no host callback, stock convolutions,
  JAX's own Threefry for the noise."""
  calls = hlo.custom_call_targets(program)
  assert not calls - _SHARDING_CALLS, calls
  assert not hlo.host_callbacks(program)
  assert _count(program, "convolution") > 0
  if noise:
    # jax.random's Threefry primitive, lowered to plain StableHLO (the CPU
    # form writes the rounds out in jnp and has no such primitive).
    assert primitives["threefry2x32"]
    assert _count(program, "xor") > 0 and _count(program, "shift_left") > 0


def test_a_single_nets_training_step(monkeypatch):
  cpu_lowered, cpu_primitives = _step_program(_config(
      **{"kernels.conv": "explicit_grad", "kernels.noise": "jnp"}))
  _gpu(monkeypatch)
  lowered, primitives = _step_program(_config())
  _assert_gpu_program(lowered, primitives)
  # The CPU's explicit gradients spell the backward passes out with
  # transposes; the stock convolutions leave them to the GPU's compiler.
  assert not cpu_primitives["threefry2x32"]
  assert _count(lowered, "transpose") <= 1 < _count(cpu_lowered, "transpose")
  assert _count(lowered, "convolution") < _count(cpu_lowered, "convolution")


def test_an_ensembles_training_step(monkeypatch):
  members = {"model.ensemble_size": 2}
  cpu_lowered, _ = _step_program(_config(**members, **{
      "kernels.conv": "explicit_grad", "kernels.noise": "jnp",
      "kernels.member_execution": "batched"}))
  _gpu(monkeypatch)
  lowered, primitives = _step_program(_config(**members))
  _assert_gpu_program(lowered, primitives)
  # Batched members (nn.vmap): the stock weight gradients are the
  # backward-filter form (the cotangent as window, one batch group per
  # member), which cuDNN runs as such; the explicit ones become forward
  # convolutions grouped by feature with activation-sized (32x32) windows.
  convs, cpu_convs = _convolutions(lowered), _convolutions(cpu_lowered)
  assert max(w for w, features, _ in convs if features > 1) == 3
  assert any(batches == 2 and w == 32 for w, _, batches in convs)
  assert max(w for w, features, _ in cpu_convs if features > 1) == 32
  assert all(batches == 1 for _, _, batches in cpu_convs)


def test_a_sweeps_training_step(monkeypatch):
  _gpu(monkeypatch)
  configs = [_config(), _config(**{"model.noise_coef": 0.2})]
  sweep = program.Runs.build(configs)
  exp = sweep.exps[0]
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  single = jax.eval_shape(exp.initial_state)
  state = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((sweep.size, *x.shape), x.dtype), single)
  values = {k: jnp.asarray(v) for k, v in sweep.values.items()}
  assert "model.noise_coef" in values   # each run's traced coefficient
  lowered, primitives = _cuda(sweep.train_step, state, batch,
                      sweep.keys("train"), 0, values)
  _assert_gpu_program(lowered, primitives)


def _eval_inputs(config):
  exp = build.Experiment.build(config)
  eval_apply, _ = build.model_fns(exp.model)
  state = jax.eval_shape(exp.initial_state)
  variables = {"params": state["params"], "batch_stats": state["batch_stats"]}
  images = jax.ShapeDtypeStruct((8, 32, 32, 3), jnp.float32)
  labels = jax.ShapeDtypeStruct((8,), jnp.int32)
  return eval_apply, (variables, images, labels, jax.random.key(0))


def test_validation_and_the_strong_protocols_attacks(monkeypatch):
  _gpu(monkeypatch)
  config = _config()
  eval_apply, args = _eval_inputs(config)
  suite = {**validation.attacks(config),
           **suites.strong_attacks(stochastic=True, eot_samples=2,
                                   check_draws=1, num_iters=2,
                                   num_targets=2),
           "nattack": functools.partial(attacks.nattack, population=4,
                                        max_iters=2, chunk=0),
           # Called alone: the clean check and a lone run's buckets.
           "apgd_alone": functools.partial(attacks.apgd, num_iters=2)}
  assert {"natural", "pgd2", "apgd_ce", "apgd_dlr", "apgd_t"} <= set(suite)
  del suite["natural"]   # the images as they are: no program
  # The prediction the accuracies come from, then each attack.
  suite["predict"] = lambda apply_fn, variables, images, labels, key: (
      apply_fn(variables, images, key))
  for name, attack in suite.items():
    lowered, primitives = _cuda(
        jax.jit(functools.partial(attack, eval_apply)), *args)
    _assert_gpu_program(lowered, primitives)
    assert _count(lowered, "transpose") <= 1, name


def test_the_cpus_selections_fail_these_checks():
  # The checks can fail: a CPU's program, lowered for CUDA, holds its
  # kernels (oneDNN's custom calls where fkjax's CPU library builds, else
  # the written-out Threefry).
  config = _config()
  eval_apply, args = _eval_inputs(config)
  variables, images, _, key = args
  lowered, primitives = _cuda(jax.jit(eval_apply), variables, images, key)
  with pytest.raises(AssertionError):
    _assert_gpu_program(lowered, primitives)


# --------------------------------------------------------------------------
# NAttack's population chunk follows the device's memory.


class _Device:
  """A device that reports its memory as a GPU's does."""

  def __init__(self, limit, in_use=0):
    self.stats = {"bytes_limit": limit, "bytes_in_use": in_use}

  def memory_stats(self):
    return self.stats


def test_nattack_chunk_follows_the_devices_memory():
  params, images, labels = tiny_models.trained_mlp()
  apply_fn, key = tiny_models.noisy_relu_mlp, jax.random.key(0)
  per_member = population_chunk.forward_bytes(apply_fn, params, images[:8],
                                              key)
  assert per_member >= images[:8].nbytes
  # Twice the batch, about twice the bytes.
  assert 1.5 * per_member < population_chunk.forward_bytes(
      apply_fn, params, images[:16], key) < 2.5 * per_member
  chunk = lambda device, population=10**6: attacks.nattack_auto_chunk(
      apply_fn, params, images[:8], key, population, device=device)
  free = 2**30
  assert chunk(_Device(free)) == int(free * population_chunk.MEMORY_FRACTION
                                     // per_member)
  assert chunk(_Device(2 * free, in_use=free)) == chunk(_Device(free))
  assert chunk(_Device(4 * free)) > 3 * chunk(_Device(free))
  assert chunk(_Device(free), population=300) == 300
  assert chunk(_Device(per_member)) == 1
  # A CPU reports nothing: its default.
  assert jax.local_devices()[0].memory_stats() is None or (
      jax.default_backend() != "cpu")
  if jax.default_backend() == "cpu":
    assert chunk(None, population=300) == population_chunk.CPU_CHUNK


def test_nattack_gives_the_same_images_whatever_the_chunk():
  params, images, labels = tiny_models.trained_mlp()
  images, labels = images[:6], labels[:6]
  run = lambda chunk: np.asarray(jax.jit(functools.partial(
      attacks.nattack, tiny_models.noisy_relu_mlp, epsilon=0.1,
      population=6, max_iters=3, chunk=chunk))(
          params, images, labels, jax.random.key(4)))
  whole = run(None)
  assert not np.array_equal(whole, np.asarray(images))
  for chunk in (1, 4, "auto", 0):
    np.testing.assert_array_equal(run(chunk), whole)


# --------------------------------------------------------------------------
# train.py with a GPU's selections, killed and resumed.


@pytest.mark.slow   # two train.py processes: minutes on 2 shared cores
def test_train_py_trains_and_resumes_with_a_gpus_selections(tmp_path):
  env = subprocess_env(tmp_path / "cache")
  env[kernels.PLATFORM_ENV] = "gpu"
  workdir = tmp_path / "run"
  cmd = _cmd("train.py", workdir, [
      "--config.num_devices=1", "--config.training.checkpoint_every_steps=2"])
  first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  marker = workdir / "checkpoints" / "6"
  deadline = time.time() + TIMEOUT_S
  while not marker.exists() and first.poll() is None and (
      time.time() < deadline):
    time.sleep(0.05)
  first.send_signal(signal.SIGKILL)
  assert first.wait() == -signal.SIGKILL
  second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
  assert second.returncode == 0, second.stdout + second.stderr
  log = second.stdout
  assert "resumed from step" in log
  assert "conv xla, noise model" in log
  assert "precision float32 (matmuls and convolutions at HIGHEST)" in log
  config = _config()
  checkpointer = ckpt_lib.Checkpointer(str(workdir), must_exist=True)
  try:
    step, state = build.Experiment.build(config).restore(
        checkpointer, "latest")
  finally:
    checkpointer.close()
  assert step == 12
  assert all(np.isfinite(np.asarray(x)).all()
             for x in jax.tree.leaves(state["params"]))
