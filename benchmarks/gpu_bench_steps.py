"""In-process measurements of ``benchmarks.gpu_bench``: roofs, steps, sweeps.

* :func:`roofs`: the device's dense matrix-product rates (bfloat16, float32
  at JAX's default precision and at ``Precision.HIGHEST``) and its copy
  bandwidth (an element-wise pass over a large array, read + written).
* :func:`measure_step`: one training step as ``train.py`` runs it
  (``fkjax.training.step.make_train_step`` jitted with the state donated),
  on one batch kept on the device: its compile time, ms per step, images/s,
  and TFLOP/s from the arithmetic XLA's cost analysis counts in it.
* :func:`measure_step_in_subprocess`: :func:`measure_step` in a fresh
  Python process with the environment given (``XLA_FLAGS``, read once
  when JAX starts: ``python -m benchmarks.gpu_bench_steps SPEC``).
* :func:`measure_sweep`: the same step for N runs on a run axis
  (``fkjax.training.sweep.Runs``, the program ``python -m reproduce
  --sweep`` and ``configs/sweep.py`` train).

Every timing blocks on its result; medians (and minima) of ``repeats``
calls after ``warmup`` calls.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from configs import default as default_config
from fkjax.training import build
from fkjax.training import step as step_lib
from fkjax.training import sweep as sweep_lib

# steps_per_epoch only shapes the learning-rate schedule, not the step's cost
_SCHEDULE_STEPS = 352


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """A training step to time.

  Attributes:
    model: a ``configs/default.py`` model preset (``resnet20``,
      ``en2resnet20``, ...).
    precision: ``config.precision`` (``float32``, ``tf32``, ``bfloat16``).
    conv: ``config.kernels.conv`` (``auto``, ``xla``; on CPUs also
      ``onednn`` and ``explicit_grad``).
    attack_steps: PGD iterations; 0 is a clean (natural) training step.
    batch_size: images per step.
  """
  model: str
  precision: str
  conv: str
  attack_steps: int
  batch_size: int


def step_config(spec: StepSpec):
  """``configs/default.py`` with ``spec``'s model, precision, kernels, PGD
  iterations and batch size (everything else the paper's)."""
  config = default_config.get_config(spec.model)
  config.kernels.conv = spec.conv
  config.precision = spec.precision
  config.training.batch_size = spec.batch_size
  if spec.attack_steps:
    config.attack.num_steps = spec.attack_steps
  else:
    config.training.adversarial = False
  return config


def _timed(call: Callable[[], Any], repeats: int, warmup: int
           ) -> list[float]:
  """Seconds of each of ``repeats`` calls of ``call`` (blocking) after
  ``warmup`` calls."""
  for _ in range(warmup):
    jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return times


def _best_rate(call: Callable[[], Any], work: float, calls: int,
               trials: int = 3) -> float:
  """The best of ``trials`` rates ``work * calls / seconds`` of ``calls``
  back-to-back calls (dispatched together, blocked once)."""
  jax.block_until_ready(call())
  best = 0.0
  for _ in range(trials):
    start = time.perf_counter()
    out = None
    for _ in range(calls):
      out = call()
    jax.block_until_ready(out)
    best = max(best, work * calls / (time.perf_counter() - start))
  return best


def roofs(matmul_size: int, copy_mib: int, calls: int) -> dict[str, Any]:
  """The device's ceilings: TFLOP/s of ``matmul_size``^2 products and the
  GB/s of an element-wise pass over ``copy_mib`` MiB of float32."""
  n = matmul_size
  keys = jax.random.split(jax.random.key(0))
  out: dict[str, Any] = {"matmul_size": n, "copy_mib": copy_mib}
  for name, dtype, precision in (
      ("matmul_bf16_tflops", jnp.bfloat16, None),
      ("matmul_float32_tflops", jnp.float32, None),
      ("matmul_float32_highest_tflops", jnp.float32,
       jax.lax.Precision.HIGHEST)):
    a, b = (jax.random.normal(k, (n, n), dtype) for k in keys)
    dot = jax.jit(lambda a, b, p=precision: jnp.dot(a, b, precision=p))
    out[name] = _best_rate(lambda: dot(a, b), 2 * n ** 3 / 1e12, calls)
    del a, b
  x = jnp.ones((copy_mib * 2 ** 20 // 4,), jnp.float32)
  double = jax.jit(lambda x: x * 2.0)
  # every byte read once and written once
  out["copy_gb_per_s"] = _best_rate(lambda: double(x), 2 * x.nbytes / 1e9,
                                    calls)
  return out


def step_flops(spec: StepSpec) -> float:
  """The floating-point operations of one ``spec`` step, as XLA's cost
  analysis counts them in the lowered step with the stock convolution.

  XLA counts a loop's body once whatever its trip count, and nothing inside
  a custom call (oneDNN's convolutions on CPUs), so the PGD-k step's count
  is that of the 0-iteration program plus k times the difference the
  1-iteration program makes, all with ``kernels.conv="xla"`` (every conv
  choice computes the same convolutions).
  """
  def counted(attack_steps: int, adversarial: bool) -> float:
    config = step_config(dataclasses.replace(spec, conv="xla",
                                             attack_steps=attack_steps))
    config.training.adversarial = adversarial
    config.attack.num_steps = attack_steps
    model = build.create_model(config, 10)
    optimizer = build.create_optimizer(config, _SCHEDULE_STEPS)
    state = jax.eval_shape(lambda: build.init_state(
        model, optimizer, jax.random.key(0)))
    batch = {"image": jax.ShapeDtypeStruct((spec.batch_size, 32, 32, 3),
                                           jnp.float32),
             "label": jax.ShapeDtypeStruct((spec.batch_size,), jnp.int32)}
    step = jax.jit(step_lib.make_train_step(model, optimizer, config))
    cost = step.lower(state, batch, jax.random.key(1)).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])

  if not spec.attack_steps:
    return counted(0, adversarial=False)
  base = counted(0, adversarial=True)
  return base + spec.attack_steps * (counted(1, adversarial=True) - base)


def _host_batch(batch_size: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  return {"image": rng.random((batch_size, 32, 32, 3), dtype=np.float32),
          "label": rng.integers(0, 10, batch_size).astype(np.int32)}


def _summary(times: list[float], images: int, flops: float | None
             ) -> dict[str, Any]:
  median = statistics.median(times)
  out = {"step_ms_median": 1e3 * median, "step_ms_min": 1e3 * min(times),
         "images_per_s": images / median}
  if flops is not None:
    out["flops_per_step"] = flops
    out["tflops_per_s"] = flops / median / 1e12
  return out


def measure_step(spec: StepSpec, repeats: int, warmup: int
                 ) -> dict[str, Any]:
  """Times ``spec``'s step: compile seconds, then ``repeats`` steps."""
  config = step_config(spec)
  model = build.create_model(config, 10)
  optimizer = build.create_optimizer(config, _SCHEDULE_STEPS)
  state = build.init_state(model, optimizer, jax.random.key(0))
  batch = jax.device_put(_host_batch(spec.batch_size))
  key = jax.random.key(1)
  step = jax.jit(step_lib.make_train_step(model, optimizer, config),
                 donate_argnums=(0,))
  start = time.perf_counter()
  compiled = step.lower(state, batch, key).compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state}

  def call():
    holder["state"], metrics = compiled(holder["state"], batch, key)
    return metrics

  times = _timed(call, repeats, warmup)
  resolved = build.resolve_kernels(config).names
  extra = {}
  try:
    flops = step_flops(spec)
  except Exception as e:  # pylint: disable=broad-except
    # A backend without XLA's cost analysis keeps the timings.
    flops, extra["flops_error"] = None, f"{type(e).__name__}: {e}"[:300]
  return {**dataclasses.asdict(spec), "conv_resolved": resolved["conv"],
          "member_execution": resolved["member_execution"],
          "depth": config.model.depth,
          "ensemble_size": config.model.ensemble_size,
          "compile_s": compile_s, **_summary(times, spec.batch_size, flops),
          "repeats": repeats, **extra}


def sweep_configs(spec: StepSpec, runs: int) -> list[Any]:
  """``runs`` configs of ``spec`` differing in their seed, one batch stream
  (as ``python -m reproduce --sweep`` sweeps a row's seeds), on a few
  synthetic images (the step does not read the data set)."""
  configs = []
  for seed in range(runs):
    config = step_config(spec)
    b = spec.batch_size
    config.dataset.source = "synthetic"
    config.dataset.synthetic_sizes = (3 * b, b)
    config.dataset.val_size = b
    config.validation.batch_size = b
    config.num_devices = 1
    config.progress = False
    config.seed = seed
    configs.append(config)
  return sweep_lib.with_data_seed(configs, "shared")


def measure_sweep(spec: StepSpec, runs: int, repeats: int, warmup: int
                  ) -> dict[str, Any]:
  """Times one step of ``runs`` runs of ``spec`` as one sweep program."""
  sweep = sweep_lib.Runs.build(sweep_configs(spec, runs))
  state = sweep.initial_state()
  batch = sweep.place_batch(_host_batch(spec.batch_size))
  keys, values = sweep.keys("train"), sweep.placed_values()
  start = time.perf_counter()
  compiled = sweep.train_step.lower(state, batch, keys, 0, values).compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state, "step": 0}

  def call():
    holder["state"], metrics = compiled(holder["state"], batch, keys,
                                        holder["step"], values)
    holder["step"] += 1
    return metrics

  times = _timed(call, repeats, warmup)
  return {**dataclasses.asdict(spec), "runs": runs, "compile_s": compile_s,
          **_summary(times, runs * spec.batch_size, None),
          "repeats": repeats}


def measure_step_in_subprocess(spec: StepSpec, repeats: int, warmup: int,
                               env: dict[str, str], timeout_s: float
                               ) -> dict[str, Any]:
  """:func:`measure_step` in ``python -m benchmarks.gpu_bench_steps`` under
  ``env``.

  Raises:
    RuntimeError: it failed or ran past ``timeout_s`` (with the end of its
      output).
  """
  argv = [sys.executable, "-m", "benchmarks.gpu_bench_steps",
          json.dumps(dataclasses.asdict(spec)), str(repeats), str(warmup)]
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"the step ran past {timeout_s:.0f} s") from e
  if proc.returncode:
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    raise RuntimeError(f"exited {proc.returncode}: " + " | ".join(tail))
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
  """``SPEC REPEATS WARMUP``: prints :func:`measure_step`'s figures as one
  JSON line."""
  from fkjax import kernels  # pylint: disable=import-outside-toplevel
  kernels.apply_xla_flags()   # as train.py and gpu_bench do
  spec = StepSpec(**json.loads(argv[0]))
  print(json.dumps(measure_step(spec, int(argv[1]), int(argv[2]))))


if __name__ == "__main__":
  main(sys.argv[1:])
