"""A finished run's evaluated weights as one compressed file, ``weights.npz``.

What ``eval.py`` evaluates: the sparse ``u`` of the checkpoint
``config.eval.checkpoint`` (``w`` itself without a sparsifier) and the
BatchNorm statistics, float32, each array under its path in the variables
(``params/Block_0/Conv_0/kernel``). ``np.savez_compressed`` stores them
losslessly: a pruned net's zeros cost next to nothing. The file is kept with
the run under ``results/`` (:mod:`reproduce.archive`) and read back by
:func:`fkjax.pretrained.load`.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

WEIGHTS_FILE = "weights.npz"
_SEP = "/"


def flatten(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """``{"params/a/kernel": array, ...}`` from nested variables."""
  out: dict[str, np.ndarray] = {}

  def walk(node, prefix):
    for key in sorted(node):
      if _SEP in str(key):
        raise ValueError(f"variable name {key!r} holds {_SEP!r}")
      value = node[key]
      path = f"{prefix}{_SEP}{key}" if prefix else str(key)
      if isinstance(value, Mapping):
        walk(value, path)
      else:
        out[path] = np.asarray(value)
  walk(variables, "")
  return out


def unflatten(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The nested variables of :func:`flatten`'s output."""
  out: dict[str, Any] = {}
  for path, value in flat.items():
    *parents, leaf = path.split(_SEP)
    node = out
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def save(path: str, variables: Mapping[str, Any]) -> None:
  """Writes ``variables`` to ``path`` (whole or not at all after a kill)."""
  tmp = f"{path}.tmp{os.getpid()}.npz"
  np.savez_compressed(tmp, **flatten(variables))
  os.replace(tmp, path)


def load(path: str) -> dict[str, Any]:
  """The nested variables saved in ``path``, as numpy arrays."""
  with np.load(path, allow_pickle=False) as data:
    return unflatten({k: data[k] for k in data.files})


def publish(config: Any, workdir: str, exp: Any = None) -> str:
  """Writes ``<workdir>/weights.npz``: the evaluated variables of the
  checkpoint ``config.eval.checkpoint``; returns its path."""
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax import experiment  # pylint: disable=import-outside-toplevel
  _, _, state = experiment.restore_checkpoint(workdir, config, exp)
  variables = jax.device_get(experiment.eval_variables(state, config))
  path = os.path.join(workdir, WEIGHTS_FILE)
  save(path, variables)
  return path


# --------------------------------------------------------------------------
# What publishing costs: ``python -m reproduce.weights``.


def compressed_bytes(variables: Mapping[str, Any]) -> int:
  """The size of ``variables`` as :func:`save` writes them."""
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
  from fkjax import experiment  # pylint: disable=import-outside-toplevel
  config = default.get_config(presets)
  model = experiment.create_model(config, 10)
  variables = jax.device_get(model.init(
      {"params": jax.random.PRNGKey(0), "noise": jax.random.PRNGKey(1)},
      np.zeros((1, 32, 32, 3), np.float32), train=False))
  raw = sum(v.nbytes for v in flatten(variables).values())
  return {"raw": raw, "compressed": compressed_bytes(
      prune_channels(variables, channel_share))}


def main() -> int:
  """Prints what a published run costs per net, and the queue's total."""
  import collections  # pylint: disable=import-outside-toplevel
  from reproduce import queue as queue_lib  # pylint: disable=C0415
  from reproduce import scales  # pylint: disable=C0415
  from reproduce import tables  # pylint: disable=C0415
  nets = collections.Counter()
  for e in queue_lib.default_entries():
    row = tables.TABLES[e.table].row(e.row)
    config = scales.build_config(row.presets, row.overrides,
                                 scales.SCALES[e.scale.partition("-")[0]],
                                 e.seed)
    net = (f"en{config.model.ensemble_size}resnet{config.model.depth}"
           if config.model.ensemble_size > 1 else
           f"resnet{config.model.depth}")
    nets[net, config.sparsity.method != "none"] += 1
  total = 0.0
  print("| net | pruned | runs queued | raw MB | npz MB | all runs MB |")
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
  print(f"\nevery queued run published: {total / 1e6:.0f} MB")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
