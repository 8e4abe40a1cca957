"""XLA's memory estimate of NAttack's compiled program (compiles, never runs).

  python -m benchmarks.experiments.nattack_memory en5resnet20 \
      --batch 500 --chunks none:none,10:none,10:100

Each ``CHUNK:IMAGE_CHUNK`` pair is ``nattack(chunk=..., image_chunk=...)``
("none" for None) with the population and iterations of ``configs/default.py``.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import time

import jax
import jax.numpy as jnp

from configs import default
from fkjax.training import build
from fkjax.training import sparsify
from fkjax import kernels

nattack_lib = importlib.import_module("fkjax.attacks.nattack")


def _int_or_none(text: str) -> int | None:
  return None if text == "none" else int(text)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model", help="a configs/default.py preset")
  parser.add_argument("--batch", type=int, default=500)
  parser.add_argument("--chunks", default="none:none,10:none,10:100")
  args = parser.parse_args()
  kernels.apply_xla_flags()  # before JAX starts its backend
  config = default.get_config(args.model)
  model = build.create_model(config, 10)
  eval_apply, _ = build.model_fns(model)
  state = build.init_state(model, build.create_optimizer(config, 391),
                           jax.random.key(0))
  variables = sparsify.eval_variables(state, config)
  images = jax.ShapeDtypeStruct((args.batch, 32, 32, 3), jnp.float32)
  labels = jax.ShapeDtypeStruct((args.batch,), jnp.int32)
  for pair in args.chunks.split(","):
    chunk, image_chunk = (_int_or_none(t) for t in pair.split(":"))
    attack = jax.jit(functools.partial(
        nattack_lib.nattack, eval_apply, epsilon=config.attack.epsilon,
        population=config.eval.nattack_population,
        max_iters=config.eval.nattack_iters, chunk=chunk,
        image_chunk=image_chunk))
    start = time.perf_counter()
    compiled = attack.lower(variables, images, labels,
                            jax.random.key(0)).compile()
    memory = compiled.memory_analysis()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
             + memory.temp_size_in_bytes) / 2**30
    print(f"{args.model} batch {args.batch} chunk {chunk} image_chunk "
          f"{image_chunk}: XLA memory estimate {total:.2f} GiB, compile "
          f"{time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
  main()
