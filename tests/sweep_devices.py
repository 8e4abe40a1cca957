"""A sweep's steps on 4 devices (batch or runs sharded), and one run alone.

Run as a subprocess with ``--xla_force_host_platform_device_count=4`` (the
device count is fixed when JAX starts). Prints one JSON line: the largest
parameter differences between the sweeps and against the single run, and
how the sharded states were placed. The run alone is on one device.
"""
import json

import jax
import numpy as np

from configs import tiny
from fkjax import data
from fkjax import kernels
from fkjax.training import build
from fkjax.training import parallel
from fkjax.training import sweep
from fkjax.training import step as step_lib

NUM_STEPS = 2


def configs(num_devices: int):
  out = []
  for i in range(4):
    c = tiny.get_config()
    c.num_devices = num_devices
    c.attack.num_steps = 1
    c.seed = i
    c.sparsity.lamb = 2e-3 * (1 + i)
    c.training.learning_rate = 0.1 / (1 + i)
    c.attack.epsilon = (8 - i) / 255
    out.append(c)
  return sweep.with_data_seed(out, "shared")


def batches(exp, config):
  return list(zip(range(NUM_STEPS), data.train_batches(
      exp.dataset.train, config.training.batch_size,
      seed=build.data_seed(config), epoch=0)))


def run_sweep(num_devices: int, shard: str):
  sw = sweep.Runs.build(configs(num_devices), shard=shard)
  state = sw.initial_state()
  keys, values = sw.keys("train"), sw.placed_values()
  for i, batch in batches(sw.exps[0], sw.template):
    state, metrics = sw.train_step(state, sw.place_batch(batch), keys, i,
                                   values)
  state, _ = sw.end_of_epoch(state, values)
  kernel = state["params"]["stem"]["kernel"]
  placement = {"devices": len(kernel.sharding.device_set),
               "spec": str(kernel.sharding.spec),
               "shard_shape": list(kernel.sharding.shard_shape(kernel.shape))}
  return jax.device_get(state["params"]), jax.device_get(
      metrics["loss"]).tolist(), placement


def run_single(index: int):
  config = configs(1)[index]
  exp = build.Experiment.build(config)
  state = exp.initial_state()
  step = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer, config))
  base = build.prng_key(config.seed, "train")
  for i, batch in batches(exp, config):
    state, metrics = step(state, parallel.shard_batch(batch, exp.mesh),
                          jax.random.fold_in(base, i))
  state = step_lib.end_of_epoch(state, config)
  return jax.device_get(state["params"]), float(metrics["loss"])


def max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def compare(a, b, atol: float) -> dict:
  """How two parameter trees differ, telling threshold flips apart.

  The sparsifiers' thresholds turn a rounding difference into a whole
  weight (or channel) kept in one tree and zeroed in the other: a *flip*.
  Returns the share of entries that flipped, the number of other entries
  that differ by more than ``atol`` (``unexplained``), and the largest
  difference of the entries that did not flip.
  """
  flips = unexplained = total = 0
  largest = 0.0
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    diff = np.abs(x - y)
    flip = (diff > atol) & ((x == 0) != (y == 0))
    flips += int(flip.sum())
    unexplained += int(((diff > atol) & ~flip).sum())
    total += x.size
    if (~flip).any():
      largest = max(largest, float(diff[~flip].max()))
  return {"flip_share": flips / total, "unexplained": unexplained,
          "max_diff": largest}


def main():
  kernels.apply_xla_flags()
  runs4, loss_runs4, place_runs4 = run_sweep(4, "runs")
  batch4, loss_batch4, place_batch4 = run_sweep(4, "batch")
  single, loss_single = run_single(3)
  last = lambda tree: jax.tree.map(lambda x: x[3], tree)
  print(json.dumps({
      "devices": jax.device_count(),
      "losses": {"batch4": loss_batch4, "runs4": loss_runs4,
                 "single3": loss_single},
      # a run per device is the one-device program (1e-8 measured); a split
      # batch reorders reductions (2e-4 measured, as for single runs)
      "runs4_vs_single3": compare(last(runs4), single, 1e-5),
      "batch4_vs_single3": compare(last(batch4), single, 2e-3),
      "batch4_vs_runs4": compare(batch4, runs4, 2e-3),
      "spread": max_diff(jax.tree.map(lambda x: x[0], runs4), last(runs4)),
      "placement": {"batch4": place_batch4, "runs4": place_runs4}}))


if __name__ == "__main__":
  main()
