"""Runs a few train steps on 1 and on 4 devices; prints the differences.

Run as a subprocess with ``--xla_force_host_platform_device_count=4`` (the
device count is fixed when JAX starts). Prints one JSON line: the natural
and the adversarial (PGD) step's results.
"""
import json
import sys

import jax
import numpy as np

from configs import tiny
from fkjax import data
from fkjax import kernels
from fkjax.training import build
from fkjax.training import parallel
from fkjax.training import step as step_lib


def run(num_devices: int, num_steps: int, adversarial: bool = True):
  config = tiny.get_config()
  config.num_devices = num_devices
  config.training.adversarial = adversarial
  exp = build.Experiment.build(config)
  state = exp.initial_state()
  step = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer, config))
  batches = data.train_batches(exp.dataset.train, config.training.batch_size,
                               seed=0, epoch=0)
  losses = []
  for i, batch in zip(range(num_steps), batches):
    state, metrics = step(state, parallel.shard_batch(batch, exp.mesh),
                          jax.random.key(i))
    losses.append(float(metrics["loss"]))
  sharding = state["params"]["stem"]["kernel"].sharding
  return losses, jax.device_get(state["params"]), len(sharding.device_set)


def compare(num_steps: int, adversarial: bool) -> dict:
  loss1, params1, dev1 = run(1, num_steps, adversarial)
  loss4, params4, dev4 = run(4, num_steps, adversarial)
  diffs = [float(np.max(np.abs(a - b))) for a, b in
           zip(jax.tree.leaves(params1), jax.tree.leaves(params4))]
  return {"losses_1": loss1, "losses_4": loss4,
          "max_param_diff": max(diffs), "devices": [dev1, dev4]}


def main():
  kernels.apply_xla_flags()  # as train.py does, before JAX starts
  num_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1
  # both kinds of step in one process: one start-up of JAX, not two
  print(json.dumps({"natural": compare(num_steps, adversarial=False),
                    "adversarial": compare(num_steps, adversarial=True)}))


if __name__ == "__main__":
  main()
