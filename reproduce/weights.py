"""Publishing a finished run's evaluated weights, and what it costs.

The file's format is the library's (:mod:`fkjax.checkpoint.weights_file`); it is kept
with the run under ``results/`` (:mod:`reproduce.archive`) and read back by
:func:`fkjax.pretrained.load`, which finds a row that another table trains
through ``results/run_names.json`` (:func:`write_names`).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from fkjax import atomic
from fkjax.checkpoint import weights_file
from fkjax.checkpoint.weights_file import WEIGHTS_FILE, flatten, unflatten
from reproduce import tables


def names() -> dict[str, dict[str, str]]:
  """Every table's rows, each with the ``"<table>/<row>"`` that trains its
  runs: what :data:`fkjax.checkpoint.weights_file.NAMES_FILE` holds."""
  out: dict[str, dict[str, str]] = {}
  for table in tables.TABLES.values():
    out[table.name] = {}
    for row in table.rows:
      owner_table, owner = (tables.resolve_shared(row) if row.shared
                            else (table, row))
      out[table.name][row.name] = f"{owner_table.name}/{owner.name}"
  return out


def write_names(results: str) -> str:
  """Writes :func:`names` to ``<results>/run_names.json`` (for
  :func:`fkjax.pretrained.load`); returns its path."""
  path = os.path.join(results, weights_file.NAMES_FILE)
  atomic.write_json(path, names())
  return path


def publish(config: Any, workdir: str, exp: Any = None) -> str:
  """Writes ``<workdir>/weights.npz``: the evaluated variables of the
  checkpoint ``config.eval.checkpoint``; returns its path."""
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  from fkjax.training import sparsify  # pylint: disable=import-outside-toplevel
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = exp or build.Experiment.build(config)
    _, state = exp.restore(checkpointer, config.eval.checkpoint)
  variables = jax.device_get(sparsify.eval_variables(state, config))
  path = os.path.join(workdir, WEIGHTS_FILE)
  weights_file.save(path, variables)
  return path


# --------------------------------------------------------------------------
# What publishing costs: ``python -m reproduce.weights``.


def compressed_bytes(variables: Mapping[str, Any]) -> int:
  """The size of ``variables`` as :func:`fkjax.checkpoint.weights_file.save` writes them."""
  import io  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  np.savez_compressed(buffer, **flatten(variables))
  return len(buffer.getvalue())


def prune_channels(variables: Mapping[str, Any], share: float,
                   seed: int = 0) -> dict[str, Any]:
  """``variables`` with ``share`` of every conv kernel's input channels
  zeroed (as RGSM leaves a pruned net), the rest unchanged."""
  rng = np.random.default_rng(seed)
  out = {}
  for path, value in flatten(variables).items():
    value = np.array(value)
    if path.startswith("params") and path.endswith("kernel") and (
        value.ndim >= 4):
      channels = value.shape[-2]
      dead = rng.permutation(channels)[:int(round(share * channels))]
      value[..., dead, :] = 0.0
    out[path] = value
  return unflatten(out)


def estimate(presets: str, channel_share: float) -> dict[str, float]:
  """Bytes of a net's published weights: its freshly initialised variables
  (random float32: trained ones compress no worse) with ``channel_share``
  of the channels pruned."""
  import jax  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  config = default.get_config(presets)
  model = build.create_model(config, 10)
  variables = jax.device_get(model.init(
      {"params": jax.random.PRNGKey(0), "noise": jax.random.PRNGKey(1)},
      np.zeros((1, 32, 32, 3), np.float32), train=False))
  raw = sum(v.nbytes for v in flatten(variables).values())
  return {"raw": raw, "compressed": compressed_bytes(
      prune_channels(variables, channel_share))}


def published_runs(scale_name: str) -> list[tuple[str, str, int]]:
  """``(table, row, seed)`` of every run ``python -m reproduce all
  --scale=<scale_name>`` trains: a shared row once, as the row that trains
  it."""
  from reproduce import runner  # pylint: disable=import-outside-toplevel
  from reproduce import scales  # pylint: disable=import-outside-toplevel
  scale = scales.SCALES[scale_name]
  out: dict[tuple[str, str, int], None] = {}
  for table in (tables.TABLES[name] for name in runner.ORDER):
    for row in table.rows:
      owner_table, owner = (tables.resolve_shared(row) if row.shared
                            else (table, row))
      for seed in range(runner.num_seeds(table, row, scale, None)):
        out[owner_table.name, owner.name, seed] = None
  return list(out)


def main(argv: list[str] | None = None) -> int:
  """Prints what a published run costs per net, and all of a scale's runs
  (``python -m reproduce.weights [gpu|paper]``, default ``gpu``)."""
  import collections  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from reproduce import scales  # pylint: disable=C0415
  argv = sys.argv[1:] if argv is None else argv
  scale_name = argv[0] if argv else "gpu"
  if scale_name not in scales.SCALES:
    print(f"error: no scale {scale_name!r}; one of {sorted(scales.SCALES)}",
          file=sys.stderr)
    return 2
  scale = scales.SCALES[scale_name]
  nets = collections.Counter()
  for table, row_name, seed in published_runs(scale_name):
    row = tables.TABLES[table].row(row_name)
    config = scales.build_config(row.presets, row.overrides, scale, seed)
    net = (f"en{config.model.ensemble_size}resnet{config.model.depth}"
           if config.model.ensemble_size > 1 else
           f"resnet{config.model.depth}")
    nets[net, config.sparsity.method != "none"] += 1
  total = 0.0
  print(f"| net | pruned | {scale_name} runs | raw MB | npz MB | "
        "all runs MB |")
  print("| --- | --- | --- | --- | --- | --- |")
  for (net, pruned), count in sorted(nets.items()):
    # RGSM at the paper's sparsities prunes a quarter to a half of the
    # channels; an unpruned net none.
    size = estimate(f"{net},none", 0.25 if pruned else 0.0)
    total += count * size["compressed"]
    print(f"| {net} | {'yes (25% of channels)' if pruned else 'no'} | "
          f"{count} | {size['raw'] / 1e6:.2f} | "
          f"{size['compressed'] / 1e6:.2f} | "
          f"{count * size['compressed'] / 1e6:.1f} |")
  print(f"\nevery {scale_name} run published "
        f"({sum(nets.values())} runs): {total / 1e6:.0f} MB")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
