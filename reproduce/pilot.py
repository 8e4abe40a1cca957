"""Pilots: single cpu-scale training runs under other rescalings of decay.

    python -m reproduce.pilot rgsm_m4_x2 [--root=workdirs/pilots]
    python -m reproduce.pilot --summary
    python -m reproduce.pilot --plot=results/pilots/rgsm_curves.png

Each pilot is one training run (ResNet20 on the real CIFAR-10) with the
``cpu`` scale's data, attack and schedule, shortened to its high learning
rate phase where the shrinkage happens, under one of the ways of rescaling
weight decay and the sparsifier's hyperparameters. It writes
``results/pilots/<name>.json``: the settings, wall time, validation and test
natural accuracy, sparsity and the weight statistics of
:mod:`reproduce.analysis`. What the committed pilots measured:
docs/notes/calibration.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

# Figure, not pyplot: it draws PNGs without choosing a global backend.
from matplotlib.figure import Figure

from fkjax import atomic
from fkjax import kernels
from fkjax import readback
from fkjax.readback import NUMBER, ListOf, MapOf
from fkjax.training import devices
from fkjax.training import train
from fkjax.workdir import metric_logging
from reproduce import analysis
from reproduce import files
from reproduce.spec import scales as scales_lib


def _pilots() -> dict[str, dict[str, Any]]:
  """name -> {presets, overrides, epochs, multiplier}."""
  rgsm = {"sparsity.lamb1": 0.1}
  rvsm = {"sparsity.beta": 0.1}
  out = {
      # weight decay x k with the paper's thresholds
      "rgsm_wd": dict(presets="resnet20,rgsm", overrides=rgsm, epochs=3,
                      multiplier="k", scale_thresholds=False),
  }
  for m in (1, 2, 4, 6, 8):
    out[f"rgsm_m{m}"] = dict(presets="resnet20,rgsm", overrides=rgsm,
                             epochs=2, multiplier=m)
    out[f"en2_rgsm_m{m}"] = dict(presets="en2resnet20,rgsm", overrides=rgsm,
                                 epochs=2, multiplier=m)
    out[f"rvsm_m{m}"] = dict(presets="resnet20,rvsm", overrides=rvsm,
                             epochs=2, multiplier=m)
    out[f"at_m{m}"] = dict(presets="resnet20,none", overrides={},
                           epochs=None, multiplier=m)
    # the whole cpu schedule: final accuracy and sparsity
    out[f"rgsm_m{m}_full"] = dict(presets="resnet20,rgsm", overrides=rgsm,
                                  epochs=None, multiplier=m)
  # The `long` variant's schedule (10 epochs, decays after 4, 6, 8) at
  # m = 4: the cpu scale's summed decay (m = 8 over 5 epochs).
  out["rgsm_m4_x2"] = dict(presets="resnet20,rgsm", overrides=rgsm,
                           epochs=None, multiplier=4, variant="long")
  out["at_m4_x2"] = dict(presets="resnet20,none", overrides={}, epochs=None,
                         multiplier=4, variant="long")
  return out


PILOTS = _pilots()

# What summary() reads of a pilot's result.
_PILOT = {"pilot": str, "config": dict, "settings": {"presets": str},
          "epochs": ListOf({"val_natural_accuracy": NUMBER}),
          "test_natural_accuracy": NUMBER, "wall_seconds": NUMBER,
          "test_accuracy?": MapOf(NUMBER),
          "analysis": {"u": {"zero_share": NUMBER,
                             "channel_sparsity": NUMBER},
                       "w": {"channel_norm_quantiles": MapOf(NUMBER)}}}


def pilot_config(name: str):
  """The config of pilot ``name``."""
  p = PILOTS[name]
  scale = scales_lib.SCALES["cpu"]
  if "variant" in p:
    scale = scales_lib.with_variant(scale, p["variant"])
  scale = scales_lib.with_multiplier(scale, p["multiplier"])
  config = scales_lib.build_config(p["presets"], p["overrides"], scale,
                                   seed=0)
  if not p.get("scale_thresholds", True):
    # weight decay (and lamb2) scaled, the thresholds left at the paper's
    paper = scales_lib.build_config(p["presets"], p["overrides"],
                                    scales_lib.SCALES["paper"], seed=0)
    config.sparsity.lamb1 = paper.sparsity.lamb1
    config.sparsity.lamb = paper.sparsity.lamb
  if p["epochs"] is not None:
    config.training.num_epochs = p["epochs"]
  # A1 and A3 as the tables read them: a schedule is only worth its cost if
  # it keeps robustness while raising natural accuracy.
  config.eval.final_attacks = "natural,ifgsm20"
  return config


def run(name: str, root: str, results_dir: str) -> dict[str, Any]:
  config = pilot_config(name)
  devices.enable_compilation_cache(config)
  workdir = os.path.join(root, name)
  start = time.time()
  summary = train.train_and_evaluate(config, workdir)
  seconds = time.time() - start
  stats = analysis.analyze_run(config, workdir)
  records = metric_logging.read_metrics(workdir)
  by_epoch = {r["epoch"]: r for r in records}
  out = {
      "pilot": name,
      "settings": PILOTS[name],
      "config": {k: v for k, v in scales_lib.flat(config).items()
                 if k.split(".")[0] in ("training", "attack", "sparsity",
                                        "dataset", "model")},
      "wall_seconds": seconds,
      "epochs": [{k: by_epoch[e].get(k) for k in (
          "epoch", "learning_rate", "train_loss", "val_natural_accuracy",
          "weight_sparsity", "channel_sparsity", "train_seconds",
          "train_images_per_second")} for e in sorted(by_epoch)],
      "test_natural_accuracy":
          summary["test"]["attacks"]["natural"]["accuracy"],
      "test_accuracy": {attack: a["accuracy"] for attack, a in
                        summary["test"]["attacks"].items()},
      "test_images": summary["test"]["num_examples"],
      "analysis": stats,
  }
  os.makedirs(results_dir, exist_ok=True)
  atomic.write_json(os.path.join(results_dir, f"{name}.json"), out)
  return out


def summary(results_dir: str) -> str:
  """A Markdown table of the finished pilots in ``results_dir``."""
  lines = ["| pilot | net, sparsifier | weight decay | threshold | epochs "
           "| val natural by epoch | test natural | test IFGSM^20 | "
           "sparsity | channel sp. | channel norms 10/50/90% | wall |",
           "|" + "---|" * 12]
  for name in sorted(os.listdir(results_dir)):
    if not name.endswith(".json"):
      continue
    path = os.path.join(results_dir, name)
    out = files.load_json(path)
    if "pilot" not in out:
      continue   # another result kept beside the pilots (e.g. ADMM's rho)
    readback.ensure(out, _PILOT, path, what="a pilot's result")
    c, a = out["config"], out["analysis"]
    s = {k.split(".", 1)[1]: v for k, v in c.items()
         if k.startswith("sparsity.")}
    if s["method"] == "rvsm":
      thr = (2 * s["lamb"] / s["beta"]) ** 0.5
    elif s["method"] == "rgsm":
      thr = (2 * s["lamb1"] / s["beta"]) ** 0.5
    else:
      thr = None
    epochs = out["epochs"]
    q = a["w"]["channel_norm_quantiles"]
    steps = sum(1 for _ in epochs)
    # a result without "test_accuracy" measured natural accuracy only
    a3 = out.get("test_accuracy", {}).get("ifgsm20")
    lines.append(
        f"| {out['pilot']} | {out['settings']['presets']} | "
        f"{c['training.weight_decay']:g} | "
        f"{'-' if thr is None else f'{thr:.3g}'} | {steps} | "
        + " / ".join(f"{e['val_natural_accuracy']:.1f}" for e in epochs)
        + f" | {out['test_natural_accuracy']:.1f} | "
        f"{'-' if a3 is None else f'{a3:.1f}'} | "
        f"{a['u']['zero_share']:.1f} | {a['u']['channel_sparsity']:.1f} | "
        f"{q['0.1']:.2f} / {q['0.5']:.2f} / {q['0.9']:.2f} | "
        f"{out['wall_seconds'] / 60:.0f} min |")
  return "\n".join(lines)


def _epoch_records(results_dir: str, name: str) -> list[dict[str, Any]]:
  """The per-epoch records of pilot ``name``: its JSON's, else those of the
  ``<name>.metrics.jsonl`` kept of a pilot stopped before it wrote one."""
  path = os.path.join(results_dir, f"{name}.json")
  if os.path.exists(path):
    return files.load_json(path, {"epochs": ListOf(dict)},
                           what="a pilot's result")["epochs"]
  records = metric_logging.read_metrics(results_dir, f"{name}.metrics.jsonl")
  return [r for r in records if "val_natural_accuracy" in r]


def rgsm_curves(results_dir: str) -> dict[str, list[dict[str, Any]]]:
  """label -> per-epoch records of the ResNet20 RGSM pilots found in
  ``results_dir`` (the rescalings m the cpu scale chose between), by m."""
  # by m ("rgsm_wd", scaled by k, has none: left out)
  chosen = sorted(((p["multiplier"], name, p) for name, p in PILOTS.items()
                   if p["presets"] == "resnet20,rgsm"
                   and isinstance(p["multiplier"], int)))
  out = {}
  for _, name, p in chosen:
    records = _epoch_records(results_dir, name)
    if records:
      schedule = ("doubled schedule" if p.get("variant") == "long" else
                  "cpu schedule" if p["epochs"] is None else
                  f"first {p['epochs']} epochs")
      planned = pilot_config(name).training.num_epochs
      if records[-1]["epoch"] < planned:
        schedule += f", stopped after epoch {records[-1]['epoch']}"
      out[f"m = {p['multiplier']}, {schedule} ({name})"] = records
  return out


def plot_rgsm_curves(results_dir: str, path: str) -> str | None:
  """Validation natural accuracy and channel sparsity by epoch of the RGSM
  pilots (:func:`rgsm_curves`), with the paper's channel sparsity for the
  same row; None (nothing drawn) when there are none."""
  curves = rgsm_curves(results_dir)
  if not curves:
    return None
  fig = Figure(figsize=(11, 3.8))
  axes = fig.subplots(1, 2)
  for label, records in curves.items():
    epochs = [r["epoch"] for r in records]
    for ax, key in zip(axes, ("val_natural_accuracy", "channel_sparsity")):
      ax.plot(epochs, [r[key] for r in records], marker="o", label=label)
  axes[1].axhline(25.33, color="gray", linestyle="--",
                  label="the paper (200 epochs): 25.33%")
  for ax, title in zip(axes, ("validation natural accuracy (%, 1,000 images)",
                              "channels pruned (%)")):
    ax.set_xlabel("epoch (352 steps of 128)")
    ax.set_title(title, fontsize=9)
  axes[1].legend(fontsize=7)
  fig.suptitle("ResNet20, RGSM λ1 = 0.1: the cpu scale's pilots, weight "
               "decay × m, thresholds × m^-1/4", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return path


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m reproduce.pilot",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", choices=sorted(PILOTS) + [[]])
  parser.add_argument("--root", default="workdirs/pilots")
  parser.add_argument("--results", default="results/pilots")
  parser.add_argument("--summary", action="store_true",
                      help="print a Markdown table of the finished pilots")
  parser.add_argument("--plot", default=None, metavar="PNG",
                      help="draw the RGSM pilots' validation accuracy and "
                      "channel sparsity by epoch into this file")
  args = parser.parse_args(argv)
  if args.summary or args.plot:
    if not os.path.isdir(args.results):
      parser.error(f"no pilot results in {args.results}: run a pilot first")
    if args.summary:
      print(summary(args.results))
    if args.plot:
      if plot_rgsm_curves(args.results, args.plot) is None:
        parser.error(f"no RGSM pilot in {args.results} to draw")
      print(f"drawn: {args.plot}")
    return 0
  if not args.names:
    parser.error("name the pilots to run, or ask for --summary or --plot")
  kernels.apply_xla_flags()   # as train.py: before JAX starts its backend
  for name in args.names:
    out = run(name, args.root, args.results)
    a = out["analysis"]["u"]
    print(f"pilot {name}: {out['wall_seconds']:.0f}s test natural "
          f"{out['test_natural_accuracy']:.2f}% sparsity {a['zero_share']:.2f}%"
          f" channel sparsity {a['channel_sparsity']:.2f}%", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
