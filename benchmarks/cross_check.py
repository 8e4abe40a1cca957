"""fkjax's APGD against torchattacks' on the same weights and images.

Usage (from the repository root; torch and torchattacks are benchmark-only
extras, ``pip install -r benchmarks/requirements-bench.txt
torchattacks==3.5.1``):

  python -m benchmarks.cross_check --workdir=workdirs/resnet8 --images 500
  python -m benchmarks.cross_check --workdir=W --images 100 --iters 20 \
      --attacks apgd_ce,apgd_t --json cross.json

Restores the checkpoint eval.py evaluates (``config.eval.checkpoint`` of the
run's own config), ports its weights to the PyTorch model of
``benchmarks/torch_reference.py`` (the model ``config.model`` describes;
the logits are checked against fkjax's on the images first) and attacks the
first ``--images`` test images with each attack on both sides:

  apgd_ce   fkjax ``attacks.apgd(loss="ce")``        torchattacks.APGD(loss="ce")
  apgd_dlr  fkjax ``attacks.apgd(loss="dlr")``       torchattacks.APGD(loss="dlr")
  apgd_t    fkjax ``attacks.apgd(loss="dlr_targeted")``  torchattacks.APGDT

with the same epsilon, iterations, restarts and (APGD-T) 9 targets. Each
side's adversarial images are scored by its own model. Prints, per attack,
both robust accuracies, the images robust for fkjax only and for
torchattacks only (per-image discordance), and the seconds of each side
(fkjax's include compiling its attack);
then the same for the worst case over the attacks. A noisy model (noise on
at test time) is attacked with ``--eot`` draws per gradient on both sides
and scored on one draw: compare such runs over several ``--seed`` values.

``--protocol`` compares the protocols instead of single attacks: fkjax's
strong protocol as eval.py runs it (``eval_strong.strong_evaluation``, one
seed: APGD-CE and APGD-DLR on the images right when clean, APGD-T on those
both left robust) against torchattacks' ``MultiAttack`` of the same three
attacks (each torchattacks APGD attacks the images right when clean, and
MultiAttack hands each attack the images the ones before it left robust):
the per-image worst case of each side, its discordance and the seconds of
each whole protocol.
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from fkjax import checkpoint as ckpt_lib
from fkjax import argtypes
from fkjax import attacks as attacks_lib
from fkjax.evaluation import strong as eval_strong
from fkjax.training import build
from fkjax.training import sparsify
from fkjax import kernels
from fkjax.config import record as run_config

ATTACKS = ("apgd_ce", "apgd_dlr", "apgd_t")
_FKJAX_LOSS = {"apgd_ce": "ce", "apgd_dlr": "dlr", "apgd_t": "dlr_targeted"}


def fkjax_robust(apply_fn, variables, images: np.ndarray, labels: np.ndarray,
                 name: str, *, epsilon: float, iters: int, restarts: int,
                 eot: int, batch: int, seed: int) -> np.ndarray:
  """Bool per image: fkjax's ``name`` left it classified right."""
  attack = jax.jit(functools.partial(
      attacks_lib.apgd, apply_fn, epsilon=epsilon, num_iters=iters,
      loss=_FKJAX_LOSS[name], n_restarts=restarts, eot_samples=eot,
      check_draws=0 if eot == 1 else 1))
  predict = jax.jit(lambda v, x, k: jnp.argmax(apply_fn(v, x, k), -1))
  out = []
  for start in range(0, len(labels), batch):
    x = jnp.asarray(images[start:start + batch])
    y = jnp.asarray(labels[start:start + batch])
    key = jax.random.fold_in(jax.random.key(seed), start)
    x_adv = attack(variables, x, y, key)
    out.append(np.asarray(predict(variables, x_adv,
                                  jax.random.fold_in(key, 1)) == y))
  return np.concatenate(out)


def torch_robust(net, images: np.ndarray, labels: np.ndarray, name: str, *,
                 epsilon: float, iters: int, restarts: int, eot: int,
                 batch: int, seed: int) -> np.ndarray:
  """Bool per image: torchattacks' ``name`` left it classified right."""
  attack = _torch_attack(net, name, epsilon=epsilon, iters=iters,
                         restarts=restarts, eot=eot, seed=seed)
  return _torch_robust_under(net, attack, images, labels, batch)


def _torch_attack(net, name: str, *, epsilon: float, iters: int,
                  restarts: int, eot: int, seed: int):
  import torchattacks  # pylint: disable=import-outside-toplevel
  common = dict(norm="Linf", eps=epsilon, steps=iters, n_restarts=restarts,
                seed=seed, eot_iter=eot)
  if name == "apgd_t":
    return torchattacks.APGDT(net, n_classes=10, **common)
  return torchattacks.APGD(net, loss=name.split("_")[1], **common)


def _torch_robust_under(net, attack, images: np.ndarray, labels: np.ndarray,
                        batch: int) -> np.ndarray:
  import torch  # pylint: disable=import-outside-toplevel
  out = []
  for start in range(0, len(labels), batch):
    x = torch.from_numpy(images[start:start + batch].transpose(0, 3, 1, 2)
                         .copy())
    y = torch.from_numpy(labels[start:start + batch].astype(np.int64))
    x_adv = attack(x, y)
    with torch.no_grad():
      out.append((net(x_adv).argmax(-1) == y).numpy())
  return np.concatenate(out)


def protocols(apply_fn, variables, net, images: np.ndarray,
              labels: np.ndarray, *, epsilon: float, iters: int,
              restarts: int, eot: int, batch: int, seed: int
              ) -> dict[str, float]:
  """fkjax's strong protocol against torchattacks' MultiAttack of the same
  attacks: worst case per image, discordance and seconds of each."""
  import torchattacks  # pylint: disable=import-outside-toplevel
  batches = [{"image": images[s:s + batch], "label": labels[s:s + batch]}
             for s in range(0, len(labels), batch)]
  start = time.perf_counter()
  result = eval_strong.strong_evaluation(
      apply_fn, variables, batches, jax.random.key(seed), epsilon=epsilon,
      stochastic=eot > 1, eot_samples=eot, num_iters=iters,
      n_restarts=restarts, num_seeds=1)
  fk_seconds = time.perf_counter() - start
  fk = np.logical_and.reduce([np.asarray(v, bool)
                              for v in result.per_image.values()])
  start = time.perf_counter()
  multi = torchattacks.MultiAttack([
      _torch_attack(net, name, epsilon=epsilon, iters=iters,
                    restarts=restarts, eot=eot, seed=seed)
      for name in ATTACKS])
  th = _torch_robust_under(net, multi, images, labels, batch)
  compile_seconds = result.predict_compile_seconds + sum(
      a.compile_seconds for a in result.attacks.values())
  return {**compare(fk, th), "fkjax_seconds": fk_seconds,
          "fkjax_compile_seconds": compile_seconds,
          "torchattacks_seconds": time.perf_counter() - start,
          "fkjax_description": result.description}


def compare(fk: np.ndarray, th: np.ndarray) -> dict[str, float]:
  """Both accuracies (%) and the per-image discordance (image counts)."""
  n = len(fk)
  return {"fkjax": 100.0 * fk.mean(), "torchattacks": 100.0 * th.mean(),
          "robust_fkjax_only": int(np.sum(fk & ~th)),
          "robust_torchattacks_only": int(np.sum(th & ~fk)), "images": n}


def load(workdir: str, num_images: int):
  """(config, fkjax apply, variables, torch net, images, labels)."""
  from benchmarks import torch_reference as ref  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  config = run_config.config_for_eval(workdir, None, {}, False)
  # The first images of the whole test set, whatever subset the run was
  # evaluated on: every run is cross-checked on the same images.
  config.dataset.test_subset_per_class = None
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = build.Experiment.build(config)
    _, state = exp.restore(checkpointer, config.eval.checkpoint)
  variables = sparsify.eval_variables(state, config)
  apply_fn, _ = build.model_fns(exp.model)
  test = exp.dataset.test
  images = test.images[:num_images].astype(np.float32) / 255.0
  labels = test.labels[:num_images].astype(np.int32)
  net = ref.create_model_from_config(config.model)
  ref.load_flax_variables(net, variables["params"], variables["batch_stats"])
  net.eval()
  if not config.model.noise_coef:
    # The port must compute fkjax's model: compare the logits first.
    want = np.asarray(apply_fn(variables, jnp.asarray(images[:8]),
                               jax.random.key(0)))
    with torch.no_grad():
      got = net(torch.from_numpy(images[:8].transpose(0, 3, 1, 2).copy()))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-3)
  return config, apply_fn, variables, net, images, labels


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--images", type=argtypes.positive_int, default=500)
  parser.add_argument("--attacks", default=",".join(ATTACKS))
  parser.add_argument("--iters", type=argtypes.positive_int, default=100)
  parser.add_argument("--restarts", type=argtypes.positive_int, default=1)
  parser.add_argument("--eot", type=argtypes.positive_int, default=1,
                      help="draws per gradient (noisy models)")
  parser.add_argument("--batch", type=argtypes.positive_int, default=250)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None, help="write the rows here")
  parser.add_argument("--protocol", action="store_true",
                      help="compare the whole protocols, not each attack")
  args = parser.parse_args(argv)
  kernels.apply_xla_flags()
  config, apply_fn, variables, net, images, labels = load(args.workdir,
                                                          args.images)
  options = dict(epsilon=config.attack.epsilon, iters=args.iters,
                 restarts=args.restarts, eot=args.eot, batch=args.batch,
                 seed=args.seed)
  if args.protocol:
    rows = {"protocol": protocols(apply_fn, variables, net, images, labels,
                                  **options)}
    print(rows["protocol"].pop("fkjax_description"))
    compiling = rows["protocol"]["fkjax_compile_seconds"]
    print(f"fkjax's seconds include {compiling:.0f} s of compiling")
    _print_table(rows)
    _save(args, rows)
    return rows
  rows, robust = {}, {"fkjax": [], "torchattacks": []}
  for name in args.attacks.split(","):
    start = time.perf_counter()
    fk = fkjax_robust(apply_fn, variables, images, labels, name, **options)
    fk_seconds = time.perf_counter() - start
    start = time.perf_counter()
    th = torch_robust(net, images, labels, name, **options)
    rows[name] = {**compare(fk, th), "fkjax_seconds": fk_seconds,
                  "torchattacks_seconds": time.perf_counter() - start}
    robust["fkjax"].append(fk)
    robust["torchattacks"].append(th)
    print(json.dumps({name: rows[name]}), flush=True)
  rows["worst_case"] = compare(np.logical_and.reduce(robust["fkjax"]),
                               np.logical_and.reduce(robust["torchattacks"]))
  _print_table(rows)
  _save(args, rows)
  return rows


def _print_table(rows: dict) -> None:
  print("| attack | fkjax % | torchattacks % | robust for fkjax only | "
        "for torchattacks only | fkjax s | torchattacks s |")
  print("|---|---|---|---|---|---|---|")
  for name, r in rows.items():
    seconds = (f"{r['fkjax_seconds']:.0f} | {r['torchattacks_seconds']:.0f}"
               if "fkjax_seconds" in r else "- | -")
    print(f"| {name} | {r['fkjax']:.1f} | {r['torchattacks']:.1f} | "
          f"{r['robust_fkjax_only']} | {r['robust_torchattacks_only']} | "
          f"{seconds} |")


def _save(args: argparse.Namespace, rows: dict) -> None:
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
