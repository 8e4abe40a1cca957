"""What each attack of the strong protocol costs (``fkjax.evaluation.suites``).

Usage (from the repository root):

  python -m benchmarks.bench_strong --models resnet8 --images 32 --iters 100
  python -m benchmarks.bench_strong --models en2resnet8 --images 16 \
      --iters 10 --json strong.json
  python -m benchmarks.bench_strong --models resnet8 --images 100 \
      --iters 100 --epsilon 0.0314 --active-set

Times APGD-CE, APGD-DLR and APGD-T (``eval_suites.strong_attacks`` with the
defaults of ``configs/default.py``: EOT 20 and 3 check draws on a noisy
model) on ``--images`` random CIFAR-shaped images of a freshly initialised
``configs/default.py`` preset. The labels are the model's own clean
predictions and epsilon is 1e-6, so no image is ever broken: every run of
every attack goes to its last iteration on every image (APGD's restarts
and targets attack only the images not yet broken), the cost of an image
that stays robust. Each attack runs ``--repeats`` times after a compiling run;
the table gives the median seconds and the ratio to APGD-CE.

``--epsilon`` sets another radius (images then break), and ``--active-set``
adds APGD-T with ``compact=False`` (every target on every image, where by
default each target attacks only the images the earlier ones left robust),
with each APGD-T row's image-runs (images attacked, summed over the
targets). ``--misclassified F`` gives a fraction ``F`` of the images
another label, so that the model misclassifies them clean, and times the
attacks as called alone (``skip_misclassified=True``, APGD's default: those
images are set aside, where the protocol's evaluator leaves them out
itself); with ``--active-set`` APGD-CE on every image is added too.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import bench_train
from configs import default as default_config
from fkjax import argtypes
from fkjax.config import names as eval_names
from fkjax.evaluation import suites as eval_suites
from fkjax.training import build
from fkjax import kernels


def bench_model(model_name: str, images: int, iters: int, repeats: int,
                epsilon: float = 1e-6, active_set: bool = False,
                misclassified: float = 0.0) -> list[dict]:
  """Rows (one per attack) of seconds per call on ``images`` images."""
  config = default_config.get_config(model_name)
  model = build.create_model(config, 10)
  apply_fn, _ = build.model_fns(model)
  host = bench_train.random_batch(images)
  x = jnp.asarray(host["image"])
  variables = model.init({"params": jax.random.key(0)}, x)
  variables = {"params": variables["params"],
               "batch_stats": variables["batch_stats"]}
  labels = jnp.argmax(apply_fn(variables, x, jax.random.key(1)), -1)
  wrong = round(misclassified * images)
  labels = labels.at[:wrong].set((labels[:wrong] + 1) % 10)
  stochastic = bool(config.model.noise_coef)
  suite = eval_suites.strong_attacks(epsilon, stochastic=stochastic,
                                     num_iters=iters, include_natural=False)
  if wrong:
    suite = {name: functools.partial(attack, skip_misclassified=True)
             for name, attack in suite.items()}
  runs = [(name, name, attack) for name, attack in suite.items()]
  if active_set:
    runs = [(label, name, functools.partial(attack, return_info=True))
            for label, name, attack in runs]
    every = ["apgd_ce", "apgd_t"] if wrong else ["apgd_t"]
    runs += [(f"{name} every image", name, functools.partial(
        suite[name], compact=False, return_info=True))
             for name in every if name in suite]
  rows = []
  for label, name, attack in runs:
    fn = jax.jit(lambda v, a, y, k, attack=attack: attack(apply_fn, v, a, y,
                                                          k))
    start = time.perf_counter()
    compiled = fn.lower(variables, x, labels, jax.random.key(2)).compile()
    compile_s = time.perf_counter() - start
    seconds, image_runs = [], None
    for r in range(repeats):
      start = time.perf_counter()
      out = jax.block_until_ready(compiled(variables, x, labels,
                                           jax.random.key(3 + r)))
      seconds.append(time.perf_counter() - start)
      if isinstance(out, tuple):
        image_runs = int(out[1]["image_runs"])
    rows.append({"model": model_name, "attack": name, "label": label,
                 "images": images, "image_runs": image_runs,
                 "iters": iters, "stochastic": stochastic,
                 "eot_samples": attack.keywords["eot_samples"],
                 "check_draws": attack.keywords["check_draws"],
                 "compile_s": compile_s,
                 "seconds": statistics.median(seconds) if seconds else None})
  return rows


def format_markdown(rows: list[dict]) -> str:
  """A Markdown table: seconds per attack and the ratio to APGD-CE."""
  lines = ["| model | attack | images | iterations | EOT | check draws | "
           "compile s | run s | x APGD-CE | image-runs |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  base = {r["model"]: r["seconds"] for r in rows
          if r.get("label", r["attack"]) == "apgd_ce"}
  for r in rows:
    ratio = (f"{r['seconds'] / base[r['model']]:.1f}"
             if r["seconds"] and base.get(r["model"]) else "-")
    run = f"{r['seconds']:.2f}" if r["seconds"] is not None else "-"
    lines.append(
        f"| {r['model']} | {eval_names.STRONG_COLUMNS[r['attack']]}"
        f"{' (every image)' if 'every' in r.get('label', '') else ''} | "
        f"{r['images']} | {r['iters']} | {r['eot_samples']} | "
        f"{r['check_draws']} | {r['compile_s']:.1f} | {run} | {ratio} | "
        f"{r.get('image_runs') if r.get('image_runs') is not None else '-'} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="resnet8",
                      help="comma-separated configs/default.py presets")
  parser.add_argument("--images", type=argtypes.positive_int, default=32)
  parser.add_argument("--iters", type=argtypes.positive_int, default=100,
                      help="APGD iterations per run")
  parser.add_argument("--repeats", type=argtypes.nonnegative_int, default=1,
                      help="timed runs after the compiling one (0: compile "
                      "only)")
  parser.add_argument("--epsilon", type=float, default=1e-6,
                      help="l_inf radius (1e-6: no image breaks)")
  parser.add_argument("--active-set", action="store_true",
                      help="also time APGD-T on every image and target")
  parser.add_argument("--misclassified", type=argtypes.fraction, default=0.0,
                      help="fraction of the images given a wrong label")
  parser.add_argument("--json", default=None, help="write the rows here")
  args = parser.parse_args(argv)
  kernels.apply_xla_flags()  # before JAX starts its backend
  rows = []
  for model in args.models.split(","):
    rows += bench_model(model, args.images, args.iters, args.repeats,
                        args.epsilon, args.active_set, args.misclassified)
  print(format_markdown(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == "__main__":
  main()
