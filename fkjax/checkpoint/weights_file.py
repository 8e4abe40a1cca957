"""A run's evaluated weights as one compressed file, ``weights.npz``.

What ``eval.py`` evaluates: the sparse ``u`` of the evaluated checkpoint
(``w`` itself without a sparsifier) and the BatchNorm statistics, each array
under its path in the variables (``params/Block_0/Conv_0/kernel``).
``np.savez_compressed`` stores them losslessly: a pruned net's zeros cost
next to nothing. :mod:`fkjax.pretrained` reads these files back by name.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fkjax import atomic

__all__ = ["NAMES_FILE", "WEIGHTS_FILE", "flatten", "load", "save",
           "unflatten"]

WEIGHTS_FILE = "weights.npz"
# Beside the published runs (``<results>/run_names.json``): every table's
# row names, each with the ``"<table>/<row>"`` whose runs it reports (a row
# that another table trains names that one), so that a name resolves without
# the tool that wrote the tables.
NAMES_FILE = "run_names.json"
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
  with atomic.replacing(path, "wb") as f:
    np.savez_compressed(f, **flatten(variables))


def load(path: str) -> dict[str, Any]:
  """The nested variables saved in ``path``, as numpy arrays."""
  with np.load(path, allow_pickle=False) as data:
    return unflatten({k: data[k] for k in data.files})
