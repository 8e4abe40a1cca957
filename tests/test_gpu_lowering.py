"""The GPU and TPU paths, checked on a CPU: fkjax's programs lowered for
CUDA and for TPU.

With an accelerator's selections forced (``FKJAX_KERNELS_PLATFORM=gpu``; a
TPU's are the same) the training step (a single net, an ensemble, a sweep
over a run axis of either), the validation and the strong protocol's
attacks (and APGD called alone) are traced once and lowered for each
platform (no compile), and their StableHLO, read as operations and
attributes, says what a GPU or a TPU would get: the stock convolutions,
every weight gradient in the backward-filter form, JAX's Threefry for the
noise, no CPU custom call, no host callback. One test trains and resumes
through ``train.py`` with a GPU's selections (the slow set's).
"""
import functools
import signal
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import conv_forms
from configs import tiny
from fkjax import attacks
from fkjax import data
from fkjax import kernels
from fkjax import checkpoint as ckpt_lib
from fkjax.attacks import population_chunk
from fkjax.config import record as run_config
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

# Custom calls a GPU or TPU program may hold: sharding annotations, not
# kernels.
_SHARDING_CALLS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"}
# What the programs are lowered for.
PLATFORMS = ("cuda", "tpu")


def _config(**values):
  config = tiny.get_config()
  config.num_devices = 1
  for key, value in values.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


class Program:
  """A jitted program traced once; lowered (and read) once per platform."""

  def __init__(self, jitted, *args):
    self.traced = jitted.trace(*args)
    self._lowered = {}

  def lowered(self, platform):
    if platform not in self._lowered:
      self._lowered[platform] = self.traced.lower(
          lowering_platforms=(platform,))
    return self._lowered[platform]

  def count(self, platform, op):
    """How many ``stablehlo.<op>`` operations the program holds."""
    return sum(1 for _ in conv_forms.operations(self.lowered(platform),
                                                f"stablehlo.{op}"))

  def custom_calls(self, platform):
    return {str(o.attributes["call_target_name"]).strip('"')
            for o in conv_forms.operations(self.lowered(platform),
                                           "stablehlo.custom_call")}

  def convolutions(self, platform):
    return conv_forms.convolutions(self.lowered(platform))


@pytest.fixture(scope="module")
def programs():
  """``programs(name, build)``: ``build()``'s :class:`Program`, built once
  for the module with the accelerators' selections (or the CPU's, where
  ``name`` starts with ``cpu``)."""
  cache = {}

  def get(name, build_program):
    if name not in cache:
      with pytest.MonkeyPatch.context() as patch:
        if not name.startswith("cpu"):
          patch.setenv(kernels.PLATFORM_ENV, "gpu")
        cache[name] = build_program()
    return cache[name]
  return get


def _step_program(config):
  """A training step of ``config``, traced."""
  exp = build.Experiment.build(config)
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  state = jax.eval_shape(exp.initial_state)
  step = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer, config))
  return Program(step, state, batch, jax.random.key(0))


def _sweep_program(configs):
  """The step of the sweep of ``configs`` (on a run axis), traced."""
  sweep = program.Runs.build(configs)
  exp = sweep.exps[0]
  batch = next(data.train_batches(exp.dataset.train, 16, seed=0, epoch=0))
  single = jax.eval_shape(exp.initial_state)
  state = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((sweep.size, *x.shape), x.dtype), single)
  values = {k: jnp.asarray(v) for k, v in sweep.values.items()}
  assert "model.noise_coef" in values   # each run's traced coefficient
  return Program(sweep.train_step, state, batch, sweep.keys("train"), 0,
                 values)


def _assert_gpu_program(prog, platform, noise=True):
  """What a GPU or TPU gets: no CPU kernel, no host callback, stock
  convolutions, JAX's own Threefry for the noise."""
  calls = prog.custom_calls(platform)
  assert not calls - _SHARDING_CALLS, calls
  assert not hlo.host_callbacks(prog.lowered(platform))
  assert prog.count(platform, "convolution") > 0
  if noise:
    # jax.random's Threefry primitive, lowered to plain StableHLO (the CPU
    # form writes the rounds out in jnp and has no such primitive).
    assert hlo.primitives(prog.traced.jaxpr)["threefry2x32"]
    assert prog.count(platform, "xor") > 0
    assert prog.count(platform, "shift_left") > 0


def _assert_backward_filter_form(prog, platform, groups):
  """Every convolution grouped by feature has a kernel's window (3x3 at
  most): no weight gradient was vmapped after it was taken (that makes a
  convolution grouped by feature whose window is a whole activation, which
  XLA does not map to a backward-filter call); ``groups`` > 1 (runs x
  members): the weight gradients are grouped by batch, one group each."""
  convs = prog.convolutions(platform)
  wide = conv_forms.wide_feature_groups(convs)
  assert not wide, wide[0]
  if groups > 1:
    assert any(c.batch_group_count == groups and c.window_above(3)
               for c in convs)
  else:
    assert not any(c.grouped for c in convs)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_single_nets_training_step(programs, platform):
  cpu = programs("cpu single", lambda: _step_program(_config(
      **{"kernels.conv": "explicit_grad", "kernels.noise": "jnp"})))
  prog = programs("single", lambda: _step_program(_config()))
  _assert_gpu_program(prog, platform)
  _assert_backward_filter_form(prog, platform, groups=1)
  # The CPU's explicit gradients spell the backward passes out with
  # transposes; the stock convolutions leave them to the GPU's compiler.
  assert not hlo.primitives(cpu.traced.jaxpr)["threefry2x32"]
  assert prog.count(platform, "transpose") <= 1 < cpu.count(platform,
                                                            "transpose")
  assert prog.count(platform, "convolution") < cpu.count(platform,
                                                         "convolution")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_an_ensembles_training_step(programs, platform):
  members = {"model.ensemble_size": 2}
  cpu = programs("cpu ensemble", lambda: _step_program(_config(**members, **{
      "kernels.conv": "explicit_grad", "kernels.noise": "jnp",
      "kernels.member_execution": "batched"})))
  prog = programs("ensemble", lambda: _step_program(_config(**members)))
  _assert_gpu_program(prog, platform)
  # Batched members (nn.vmap): the stock weight gradients are the
  # backward-filter form (the cotangent as window, one batch group per
  # member), which cuDNN runs as such; the explicit ones become forward
  # convolutions grouped by feature with activation-sized (32x32) windows.
  _assert_backward_filter_form(prog, platform, groups=2)
  cpu_convs = cpu.convolutions(platform)
  assert max(max(c.window) for c in cpu_convs
             if c.feature_group_count > 1) == 32
  assert all(c.batch_group_count == 1 for c in cpu_convs)


def _sweep_configs(**values):
  return [_config(**values),
          _config(**values, **{"model.noise_coef": 0.2})]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_sweeps_training_step(programs, platform):
  prog = programs("sweep", lambda: _sweep_program(_sweep_configs()))
  _assert_gpu_program(prog, platform)
  # Each run's weight gradient is its own, yet grouped by batch over the
  # runs as an ensemble's over its members.
  _assert_backward_filter_form(prog, platform, groups=2)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_sweep_of_ensembles_training_step(programs, platform):
  prog = programs("sweep ensembles", lambda: _sweep_program(_sweep_configs(
      **{"model.ensemble_size": 2})))
  _assert_gpu_program(prog, platform)
  _assert_backward_filter_form(prog, platform, groups=4)


def _eval_inputs(config):
  exp = build.Experiment.build(config)
  eval_apply, _ = build.model_fns(exp.model)
  state = jax.eval_shape(exp.initial_state)
  variables = {"params": state["params"], "batch_stats": state["batch_stats"]}
  images = jax.ShapeDtypeStruct((8, 32, 32, 3), jnp.float32)
  labels = jax.ShapeDtypeStruct((8,), jnp.int32)
  return eval_apply, (variables, images, labels, jax.random.key(0))


def _protocol_programs():
  """The validation's and the strong protocol's attacks, traced."""
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
  return {name: Program(jax.jit(functools.partial(attack, eval_apply)),
                        *args) for name, attack in suite.items()}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_validation_and_the_strong_protocols_attacks(programs, platform):
  for name, prog in programs("protocol", _protocol_programs).items():
    _assert_gpu_program(prog, platform)
    assert prog.count(platform, "transpose") <= 1, name


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_cpus_selections_fail_these_checks(programs, platform):
  # The checks can fail: a CPU's program, lowered for an accelerator,
  # holds its kernels (oneDNN's custom calls where fkjax's CPU library
  # builds, else the written-out Threefry).
  def cpu_predict():
    eval_apply, (variables, images, _, key) = _eval_inputs(_config())
    return Program(jax.jit(eval_apply), variables, images, key)
  with pytest.raises(AssertionError):
    _assert_gpu_program(programs("cpu predict", cpu_predict), platform)


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


@pytest.mark.slow
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
  # precision "auto": tf32 on a GPU, recorded as such
  assert "precision tf32 (" in log
  assert run_config.load_saved(str(workdir))["precision"] == "tf32"
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
