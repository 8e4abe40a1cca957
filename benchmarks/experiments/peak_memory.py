"""Measured peak memory (resident set) of training and of each evaluation.

  python -m benchmarks.experiments.peak_memory en5resnet20
  python -m benchmarks.experiments.peak_memory en5resnet20 \
      --workloads nattack --eval-batch 100 --nattack-iters 1

Each workload runs in a fresh process (``ru_maxrss`` only grows), on random
CIFAR-shaped data at the batch sizes of ``configs/default.py``: ``train``
is two PGD-10 training steps at ``training.batch_size``; an attack name runs
:class:`fkjax.evaluation.Evaluator` with that attack of the default suite on
one batch of ``eval.batch_size``. NAttack's iterations run in a loop whose
buffers do not grow with their number, so ``--nattack-iters`` only shortens
the run, and with ``--eval-batch 100`` (``eval.nattack_image_chunk``) it
attacks one group of the images a batch of 500 attacks in five groups in
a loop. The figure is the whole process's peak (Python, JAX and XLA's
runtime included), next to XLA's estimate for the compiled program.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

WORKLOADS = ("train", "natural", "fgsm", "ifgsm20", "cw", "nattack")


def _measure(model: str, workload: str, nattack_iters: int,
             eval_batch: int | None) -> dict:
  # Imported here: the parent process stays free of JAX's allocations.
  from fkjax import kernels  # pylint: disable=import-outside-toplevel
  kernels.apply_xla_flags()
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from benchmarks import bench_train  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from fkjax import evaluation  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import suites as eval_suites  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  from fkjax.training import sparsify  # pylint: disable=import-outside-toplevel

  config = default.get_config(model)
  config.eval.nattack_iters = nattack_iters
  if eval_batch:
    config.eval.batch_size = eval_batch
  start = time.perf_counter()
  if workload == "train":
    batch = config.training.batch_size
    run, info = bench_train.fkjax_runner(
        bench_train.fkjax_config(model, "pgd", batch, 10, 20, None), "pgd",
        batch)
    run()
    run()
    estimate = info.get("memory_mb")
  else:
    batch = config.eval.batch_size
    model_ = build.create_model(config, 10)
    eval_apply, _ = build.model_fns(model_)
    state = build.init_state(model_, build.create_optimizer(config, 391),
                             jax.random.key(0))
    variables = sparsify.eval_variables(state, config)
    rng = np.random.default_rng(0)
    data = [{"image": rng.random((batch, 32, 32, 3), dtype=np.float32),
             "label": rng.integers(0, 10, batch).astype(np.int32)}]
    evaluator = evaluation.Evaluator(eval_apply,
                                   eval_suites.attack_suite(workload, config))
    evaluator(variables, data, jax.random.key(1))
    estimate = bench_train._memory_mb(  # pylint: disable=protected-access
        evaluator.compiled_attacks(workload)[0])
  peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return {"model": model, "workload": workload, "batch": batch,
          "peak_rss_gb": round(peak_kb / 2**20, 2),
          "xla_estimate_mb": estimate,
          "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model", help="a configs/default.py preset")
  parser.add_argument("--workloads", default=",".join(WORKLOADS))
  parser.add_argument("--nattack-iters", type=int, default=1)
  parser.add_argument("--eval-batch", type=int, default=None,
                      help="eval.batch_size (default: the config's)")
  parser.add_argument("--json", default=None, help="write the rows here")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(_measure(args.model, args.child, args.nattack_iters,
                              args.eval_batch)))
    return
  rows = []
  for workload in args.workloads.split(","):
    if workload not in WORKLOADS:
      parser.error(f"unknown workload {workload!r}; choose from {WORKLOADS}")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.experiments.peak_memory",
         args.model, "--child", workload,
         "--nattack-iters", str(args.nattack_iters),
         *(["--eval-batch", str(args.eval_batch)] if args.eval_batch else [])],
        capture_output=True, text=True, check=True)
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(json.dumps(rows[-1]), flush=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
