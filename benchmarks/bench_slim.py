"""Inference latency and IFGSM^20 throughput of a pruned model, before and
after :func:`fkjax.slim.slim` (docs/slim.md).

  python -m benchmarks.bench_slim --config=configs/cpu.py --workdir=/tmp/run
  python -m benchmarks.bench_slim --config=... --workdir=... --noise=false \
      --impls=xla --latency_batches=1,128 --attack_batch=128 --out=slim.json

Restores the checkpoint eval.py evaluates (as export.py does), slims it, and
for each implementation (``xla``: XLA convolutions with fkjax's explicit
gradients and the jnp noise; ``onednn``: fkjax's oneDNN convolutions and
fused noise, CPU only) times the original and the slim network alike:

* latency: one jitted forward pass (eval mode, noise on unless
  ``--noise=false``) per batch size, median over ``--repeats``;
* IFGSM^20: the attack of the paper's A3 (``fkjax.evaluation``'s settings) on
  ``--attack_batch`` test images, images per second.

It also prints the parameters and multiply-adds, the largest logit
difference, and the natural and IFGSM^20 accuracy of both under the same
keys. A measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from benchmarks import bench_train
from fkjax import checkpoint as ckpt_lib
from fkjax import argtypes
from fkjax import data
from fkjax.evaluation import suites as eval_suites
from fkjax.training import build
from fkjax.training import sparsify
from fkjax import kernels
from fkjax import models
from fkjax import slim

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory that train.py wrote.")
flags.DEFINE_bool("noise", True, "Keep the noise injection.")
flags.DEFINE_string("impls", "xla,onednn", "Implementations to time.")
flags.DEFINE_string("latency_batches", "1,128", "Forward-pass batch sizes.")
flags.DEFINE_integer("attack_batch", 128, "IFGSM^20 batch size.",
                     lower_bound=1)
flags.DEFINE_integer("repeats", 5, "Timed runs of each measurement.",
                     lower_bound=1)
flags.DEFINE_string("multiples", "1,8",
                    "Slim variants: fkjax.slim.slim's `multiple` for each.")
flags.DEFINE_string("out", None, "Optional JSON file for the results.")
config_flags.DEFINE_config_file(
    "config", None, "Config file the model was trained with.",
    lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


def _is_positive_int_list(text: str) -> bool:
  try:
    argtypes.positive_int_list(text)
  except argparse.ArgumentTypeError:
    return False
  return True


for _name in ("latency_batches", "multiples"):
  flags.register_validator(
      _name, _is_positive_int_list,
      message="must be comma-separated positive integers")


def _implementations(names, ensemble_size):
  """name -> (original model kwargs, slim conv, slim inject)."""
  choices = {"xla": {"conv": "explicit_grad", "noise": "jnp"},
             "onednn": {"conv": "onednn", "noise": "fused"}}
  out = {}
  for name in names:
    if name not in choices:
      raise ValueError(f"unknown implementation {name!r}")
    try:
      resolved = kernels.resolve(choices[name], ensemble_size=ensemble_size)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("skipping %s: %s", name, e)
      continue
    out[name] = (resolved.model_kwargs, resolved.conv, resolved.inject_noise)
  return out


def _label(multiple: int) -> str:
  return "slim" if multiple == 1 else f"slim x{multiple}"


def _test_batch(test, n: int) -> tuple[jax.Array, jax.Array]:
  """The first ``n`` test images (floats) and labels; a short test set is
  repeated."""
  reps = -(-n // len(test.labels))
  images = np.concatenate([data.to_float(test.images)] * reps)[:n]
  return jnp.asarray(images), jnp.asarray(
      np.concatenate([test.labels] * reps)[:n])


def _costs(model, variables, multiples: list[int], image_size, noise: bool
           ) -> dict[str, dict[str, int]]:
  """Summed costs per slim variant; prints the first variant's table and
  every variant's totals."""
  out = {}
  for k in multiples:
    small, _ = slim.slim(model, variables, noise=noise, multiple=k)
    costs = slim.cost_report(slim.specs_of(small), image_size)
    out[_label(k)] = slim.totals(costs)
    if k == multiples[0]:
      print(slim.format_costs(costs))
  for label, t in out.items():
    print(f"{label}: parameters {t['params_before']:,} -> "
          f"{t['params_after']:,}, multiply-adds per image "
          f"{t['macs_before']:,} -> {t['macs_after']:,}")
  return out


def _nets(m, num_classes: int, variables, impl, multiples: list[int],
          noise: bool) -> dict[str, tuple]:
  """label -> (model, variables): the original (``config.model`` ``m``)
  with an implementation's kwargs, and its slim variants."""
  kwargs, conv, inject = impl
  original = models.create_model(
      depth=m.depth, num_classes=num_classes,
      ensemble_size=m.ensemble_size, width=m.width, skip=m.skip,
      noise_coef=m.noise_coef, noise_std_over=m.noise_std_over,
      normalize=m.normalize, **kwargs)
  nets = {"original": (original, variables)}
  for k in multiples:
    nets[_label(k)] = slim.slim(original, variables, noise=noise,
                                multiple=k, conv=conv, inject=inject)
  return nets


def _accuracy(forward, attack, v, x, y, key) -> dict:
  """Clean logits, natural and IFGSM^20 accuracy (%) on ``x, y``."""
  adv = attack(v, x, y, key)
  clean_logits = forward(v, x, key)
  return {
      "logits": np.asarray(clean_logits),
      "natural_accuracy": float(100 * jnp.mean(
          jnp.argmax(clean_logits, -1) == y)),
      "ifgsm20_accuracy": float(100 * jnp.mean(
          jnp.argmax(forward(v, adv, key), -1) == y)),
  }


def _runners(nets, images, labels, key, ifgsm, batches: list[int],
             attack_batch: int, noise: bool) -> tuple[dict, dict]:
  """``(runners, rows)``: the timed calls (a jitted forward pass per net and
  batch size, keyed ``(label, batch)``, then IFGSM^20 per net, keyed
  ``label``) and each net's :func:`_accuracy`."""
  forwards, attacks, rows = {}, {}, {}
  x, y = images[:attack_batch], labels[:attack_batch]
  for label, (net, v) in nets.items():
    def apply_fn(v, x, k, net=net):
      return net.apply(v, x, train=False, add_noise=noise, rngs={"noise": k})
    forward = jax.jit(apply_fn)
    for b in batches:
      forwards[(label, b)] = functools.partial(
          lambda f, v, b: f(v, images[:b], key).block_until_ready(),
          forward, v, b)
    attack = jax.jit(functools.partial(ifgsm, apply_fn))
    attacks[label] = functools.partial(
        lambda a, v: a(v, x, y, key).block_until_ready(), attack, v)
    rows[label] = _accuracy(forward, attack, v, x, y, key)
  return {**forwards, **attacks}, rows


def _summary(rows: dict, times: dict, batches: list[int], attack_batch: int
             ) -> dict:
  """The JSON result of one implementation: accuracies, median latencies
  and attack throughput per net, and the largest logit difference."""
  res = {"max_logit_difference": max(float(np.max(np.abs(
      rows["original"]["logits"] - rows[label]["logits"])))
                                       for label in rows)}
  for label, row in rows.items():
    res[label] = {
        "natural_accuracy": row["natural_accuracy"],
        "ifgsm20_accuracy": row["ifgsm20_accuracy"],
        "latency_ms": {b: 1e3 * statistics.median(times[(label, b)])
                       for b in batches},
        "ifgsm20_images_per_s": attack_batch / statistics.median(
            times[label]),
    }
  return res


def _print_summary(name: str, res: dict, labels, batches: list[int]) -> None:
  print(f"\n[{name}] max |logit difference| "
        f"{res['max_logit_difference']:.3g}")
  print(f"{'':10s}" + "".join(f"{'ms @ batch ' + str(b):>16s}"
                              for b in batches)
        + f"{'IFGSM20 img/s':>16s}{'natural %':>12s}{'IFGSM20 %':>12s}")
  for label in labels:
    r = res[label]
    print(f"{label:10s}" + "".join(f"{r['latency_ms'][b]:16.1f}"
                                   for b in batches)
          + f"{r['ifgsm20_images_per_s']:16.1f}"
          + f"{r['natural_accuracy']:12.1f}{r['ifgsm20_accuracy']:12.1f}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  kernels.apply_xla_flags()  # before JAX starts its backend
  config = FLAGS.config
  # The checkpoint eval.py evaluates, as export.py restores it.
  with ckpt_lib.Checkpointer(FLAGS.workdir, must_exist=True) as checkpointer:
    exp = build.Experiment.build(config)
    step, state = exp.restore(checkpointer, config.eval.checkpoint)
  variables = sparsify.eval_variables(state, config)
  add_noise = FLAGS.noise
  batches = argtypes.positive_int_list(FLAGS.latency_batches)
  multiples = argtypes.positive_int_list(FLAGS.multiples)
  test = exp.dataset.test
  images, labels = _test_batch(test, max(batches + [FLAGS.attack_batch]))
  key = jax.random.key(config.seed + 2)
  ifgsm = eval_suites.attack_suite("ifgsm20", config)["ifgsm20"]
  results = {"workdir": FLAGS.workdir, "step": int(step), "noise": add_noise,
             "device": jax.devices()[0].device_kind,
             "costs": _costs(exp.model, variables, multiples,
                             test.images.shape[1:3], add_noise),
             "impls": {}}
  for name, impl in _implementations(
      FLAGS.impls.split(","), config.model.ensemble_size).items():
    nets = _nets(config.model, exp.dataset.num_classes, variables, impl,
                 multiples, add_noise)
    runners, rows = _runners(nets, images, labels, key, ifgsm, batches,
                             FLAGS.attack_batch, add_noise)
    times = bench_train.interleaved(runners, FLAGS.repeats, warmup=1)
    results["impls"][name] = _summary(rows, times, batches,
                                      FLAGS.attack_batch)
    _print_summary(name, results["impls"][name], nets, batches)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
