"""How long the training loop waits for a checkpoint save.

    python -m benchmarks.experiments.save_blocking --model en2resnet20

Saves a ``--model`` training state (``configs/default.py``) ``--saves``
times with ``fkjax.checkpoint.Checkpointer``, synchronous and then
asynchronous (``train.py``'s), ``--between`` seconds apart (an epoch's
training, when the previous asynchronous write finishes), and prints the
seconds each ``save()`` call held its caller, and ``close()``'s wait.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
  p = argparse.ArgumentParser(
      prog="python -m benchmarks.experiments.save_blocking")
  p.add_argument("--model", default="en2resnet20")
  p.add_argument("--saves", type=int, default=5)
  p.add_argument("--between", type=float, default=2.0)
  args = p.parse_args()
  # pylint: disable=import-outside-toplevel
  import jax
  from configs import default as default_config
  from fkjax import checkpoint as ckpt_lib
  from fkjax.training import build
  config = default_config.get_config(args.model)
  state = build.init_state(build.create_model(config, 10),
                           build.create_optimizer(config, 352),
                           jax.random.key(0))
  out = {"model": args.model, "state_mib": sum(
      x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
                                            / 2 ** 20}
  for asynchronous in (False, True):
    checkpointer = ckpt_lib.Checkpointer(tempfile.mkdtemp(),
                                         asynchronous=asynchronous)
    held = []
    for step in range(1, args.saves + 1):
      start = time.perf_counter()
      checkpointer.save(step, state, val_accuracy=float(step))
      held.append(round(time.perf_counter() - start, 3))
      time.sleep(args.between)
    start = time.perf_counter()
    checkpointer.close()
    name = "asynchronous" if asynchronous else "synchronous"
    out[f"{name}_save_s"] = held
    out[f"{name}_close_s"] = round(time.perf_counter() - start, 3)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
