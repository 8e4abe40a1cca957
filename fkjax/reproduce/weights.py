"""A finished run's evaluated weights as one compressed file, ``weights.npz``.

What ``eval.py`` evaluates: the sparse ``u`` of the checkpoint
``config.eval.checkpoint`` (``w`` itself without a sparsifier) and the
BatchNorm statistics, float32, each array under its path in the variables
(``params/Block_0/Conv_0/kernel``). ``np.savez_compressed`` stores them
losslessly: a pruned net's zeros cost next to nothing. The file is kept with
the run under ``results/`` (:mod:`fkjax.reproduce.archive`) and read back by
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
