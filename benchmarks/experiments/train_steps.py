"""fkjax train steps under model variants, interleaved in one process.

  python -m benchmarks.experiments.train_steps en2resnet20 pgd \
      batched,sequential,unrolled --repeats 3

Variants: a member_execution ("batched", "sequential", "unrolled"),
optionally with ":nonoise" (noise_coef 0) or ":jnpnoise" / ":fusednoise"
(``config.kernels.noise``). The steps are
``benchmarks/bench_train.py``'s (configs/default.py presets, batch 128).
"""
from __future__ import annotations

import argparse
import statistics

from benchmarks import bench_train
from fkjax import kernels


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model")
  parser.add_argument("bench", choices=["clean", "pgd"])
  parser.add_argument("variants")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--batch", type=int, default=128)
  args = parser.parse_args()
  kernels.apply_xla_flags()
  runs = {}
  for variant in args.variants.split(","):
    execution, _, extra = variant.partition(":")
    config = bench_train.fkjax_config(args.model, args.bench, args.batch,
                                      attack_steps=10, eval_steps=20,
                                      unroll=None)
    config.kernels.member_execution = execution
    if extra == "nonoise":
      config.model.noise_coef = 0.0
    elif extra in ("jnpnoise", "fusednoise"):
      config.kernels.noise = extra[:-len("noise")]
    elif extra:
      parser.error(f"unknown variant suffix {extra!r}")
    runs[variant], info = bench_train.fkjax_runner(config, args.bench,
                                                   args.batch)
    print(f"{variant}: compile {info['compile_s']:.1f} s, XLA memory "
          f"estimate {info['memory_mb']} MB", flush=True)
  times = bench_train.interleaved(runs, args.repeats, warmup=1)
  for name, seconds in times.items():
    ms = [round(1e3 * s) for s in seconds]
    print(f"{name}: median {statistics.median(ms):.0f} ms, min {min(ms)} ms, "
          f"all {ms}")


if __name__ == "__main__":
  main()
