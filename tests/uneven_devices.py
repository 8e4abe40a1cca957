"""Evaluates on 8 devices a batch size that does not divide over them;
prints one JSON line: the per-image results there and on one device, and
the rows each device's programs compute.

Run as a subprocess with ``--xla_force_host_platform_device_count=8`` (the
device count is fixed when JAX starts): ``python -m tests.uneven_devices``
(an evaluation), ``python -m tests.uneven_devices validation`` (a run's
validation, the tiny config's model; with ``FKJAX_KERNELS_PLATFORM=gpu``
for the stock convolutions, which XLA splits over the devices).
"""
import functools
import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from configs import tiny
from fkjax import attacks
from fkjax import data
from fkjax import evaluation
from fkjax import kernels
from fkjax import models
from fkjax.training import parallel
from fkjax.training import program

NUM_EXAMPLES = 37   # batches of 20 and 17 real rows: neither divides by 8
BATCH_SIZE = 20


def batch_std_model(params, images, key):
  """A linear layer with EnResNet's batch-std noise: one std per batch, so
  a padding row reaching it would change every row's prediction."""
  hidden = images.reshape(images.shape[0], -1) @ params["w"]
  return models.inject_noise(hidden, 0.5, key, std_over="batch")


def suite():
  return {
      "natural": evaluation.natural,
      "pgd": functools.partial(attacks.pgd, num_steps=3, epsilon=0.1,
                               step_size=0.05),
      # NAttack's image groups (8) and population chunks (2) over a batch
      # split unevenly.
      "nattack": functools.partial(attacks.nattack, epsilon=0.2,
                                   population=4, max_iters=2, chunk=2,
                                   image_chunk=8),
  }


def dot_rows(compiled) -> list[int]:
  """The leading dimension of every dot product of a compiled program: the
  rows one device computes."""
  return [int(m.group(1)) for m in re.finditer(
      r"= f32\[(\d+),\d+\](?:\{[^}]*\})? dot\(", compiled.as_text())]


def conv_rows(compiled) -> list[int]:
  """The leading dimension of every convolution's result (NHWC)."""
  return sorted({int(m.group(1)) for m in re.finditer(
      r"= f32\[(\d+),\d+,\d+,\d+\](?:\{[^}]*\})? convolution\(",
      compiled.as_text())})


def validation():
  """The tiny run's validation of its initial weights on 30 images in one
  batch of 500 (the default): on 8 devices and on one."""
  kernels.apply_xla_flags()
  out = {}
  for devices in (8, 1):
    config = tiny.get_config()
    config.num_devices = devices
    config.validation.batch_size = 500
    config.dataset.synthetic_sizes = (286, 60)
    config.dataset.val_size = 30
    runs = program.Runs.build([config])
    values, keys = runs.placed_values(), runs.keys("validation")
    evaluated = runs.end_of_epoch(runs.initial_state(), values)[1]
    split = runs.exps[0].dataset.val
    batch = next(runs.eval_batches(split))
    compiled = runs.validation_counts.lower(
        evaluated, batch["image"], batch["label"], keys, 0, 0,
        values).compile()
    out[devices] = {"accuracy": runs.validate(evaluated, split, keys, 0,
                                              values)[0],
                    "conv_rows": conv_rows(compiled)}
  print(json.dumps(out))


def main():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (NUM_EXAMPLES, 4, 4, 3), np.uint8)
  w = rng.normal(size=(48, 4)).astype(np.float32)
  # Labelled by the model without noise: most images start right, and the
  # noise and the attacks decide the rest.
  labels = np.argmax(data.to_float(images).reshape(NUM_EXAMPLES, -1) @ w, -1)
  split = data.Split(images, labels.astype(np.int32))
  params = {"w": jnp.asarray(w)}
  key = jax.random.key(3)
  mesh = parallel.make_mesh()
  results = {}
  for name, batches in (
      ("one_device", data.eval_batches(split, BATCH_SIZE)),
      ("devices", parallel.eval_batches(split, BATCH_SIZE, mesh))):
    evaluator = evaluation.Evaluator(batch_std_model, suite())
    result = evaluator(params, batches, key, per_image=True)
    results[name] = {k: v.astype(int).tolist()
                     for k, v in result.per_image.items()}
    results[name + "_dot_rows"] = sorted({
        r for c in evaluator.compiled_attacks("pgd") for r in dot_rows(c)})
  print(json.dumps({"num_devices": mesh.size, **results}))


if __name__ == "__main__":
  validation() if sys.argv[1:] == ["validation"] else main()
