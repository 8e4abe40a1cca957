"""This machine's training speed, measured, for ``--dry-run --calibrate``.

The runner's time estimates (:func:`reproduce.runner.estimate_seconds`)
are built from the step times of one reference machine
(:data:`reproduce.runner.REFERENCE_STEP_TIMES`: 2 idle vCPUs of an
AMD EPYC with AVX-512); CPUs of the same size differ from it by 2-3x (one
without AVX-512 trained En2ResNet20 at 0.28-0.37 steps/s against
0.73-0.81). :func:`measure` times this machine's ResNet20 training step at
batch 128, clean and with PGD, the two numbers the estimates scale with.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from configs import default as default_config
from fkjax.training import build
from fkjax.training import step as step_lib
from reproduce import runner as runner_lib


def _step_seconds(config, repeats: int) -> float:
  """The fastest of ``repeats`` training steps (after one to warm up)."""
  model = build.create_model(config, 10)
  optimizer = build.create_optimizer(config, steps_per_epoch=352)
  state = build.init_state(model, optimizer, jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = config.training.batch_size
  host = {"image": rng.random((batch, 32, 32, 3), dtype=np.float32),
          "label": rng.integers(0, 10, batch).astype(np.int32)}
  step = jax.jit(step_lib.make_train_step(model, optimizer, config),
                 donate_argnums=(0,))
  key = jax.random.key(1)
  times = []
  for _ in range(repeats + 1):
    start = time.perf_counter()
    # The host batch goes to the device every step, as in training.
    state, metrics = step(state, jax.device_put(host), key)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return min(times[1:])


def measure(repeats: int = 3, attack_steps: int = 2, *, depth: int = 20,
            batch_size: int = 128) -> runner_lib.StepTimes:
  """Times ResNet``depth`` training steps here: clean, and PGD-``attack_steps``.

  Each of the two programs is compiled, run once, then timed ``repeats``
  times (the fastest counts). About a minute for ResNet20 on 2 CPU cores.
  The estimates assume ResNet20 at batch 128; ``depth`` and ``batch_size``
  are for the tests.

  Returns:
    The seconds of a clean step and of one attack iteration on top of it.
  """
  if repeats < 1 or attack_steps < 1:
    raise ValueError("repeats and attack_steps must be >= 1, got "
                     f"{repeats} and {attack_steps}")
  config = default_config.get_config(f"resnet{depth}")
  config.training.batch_size = batch_size
  config.training.adversarial = False
  clean = _step_seconds(config, repeats)
  config.training.adversarial = True
  config.attack.num_steps = attack_steps
  attacked = _step_seconds(config, repeats)
  # Timing noise can make the difference tiny or negative on a busy machine.
  # An attack iteration is a forward and a backward pass, 0.47 of a clean
  # step on the reference machine: a quarter of one is a safe floor.
  per_iteration = max((attacked - clean) / attack_steps, 0.25 * clean)
  return runner_lib.StepTimes(clean_step=clean, attack_iteration=per_iteration)
