"""Which leaves of a user's state are weights, for the reports.

A report takes whatever tree a user holds: a params dict, a Flax linen
``variables`` dict, ``nnx.state(model)`` with its RNG streams, counters and
BatchNorm statistics, an Equinox module with its functions and flags, lists
and tuples as well as dicts. A leaf is a weight when its framework marks it
as one and it is a real floating-point array:

* Flax NNX: the values of ``nnx.Param`` (and its subclasses); every other
  ``nnx.Variable`` (``BatchStat``, ``RngKey``, ``RngCount``, optimizer state,
  user counters) is not a weight;
* Flax linen: in a variables dict (a top-level mapping with a ``"params"``
  collection), the ``"params"`` collection; ``"batch_stats"`` and the other
  collections are not weights;
* Equinox: the arrays outside ``eqx.nn.StateIndex`` (whose arrays are
  BatchNorm's initial running statistics);
* everywhere: PRNG keys, integer and boolean arrays (counters, flags) and
  leaves that are not arrays (Python numbers, strings, functions) are not
  weights.

Flax and Equinox are looked up among the modules already imported, never
imported here: a tree of theirs exists only once they are, and
``fkjax.sparsity`` needs neither.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from fkjax.sparsity import layouts as layouts_lib

PyTree = Any


@dataclasses.dataclass(frozen=True)
class SkippedLeaf:
  """A leaf a report leaves out because it is not a weight.

  Attributes:
    name: its key path, e.g. ``"bn/mean"``.
    kind: what it is instead, e.g. ``"nnx.BatchStat"``, ``"PRNG key"``,
      ``"uint32 array"``, ``"Flax collection 'batch_stats'"``,
      ``"function"``.
  """

  name: str
  kind: str


def _framework_node(node: Any) -> tuple[bool, Optional[str]]:
  """``(is a framework's variable box, what it holds when not weights)``."""
  nnx = sys.modules.get("flax.nnx")
  if nnx is not None and isinstance(node, nnx.Variable):
    return True, (None if isinstance(node, nnx.Param)
                  else f"nnx.{type(node).__name__}")
  eqx = sys.modules.get("equinox")
  if eqx is not None and isinstance(node, eqx.nn.StateIndex):
    return True, "eqx.nn.StateIndex"
  return False, None


def _leaf_kind(leaf: Any) -> Optional[str]:
  """None for a real floating-point array, else what ``leaf`` is."""
  dtype = getattr(leaf, "dtype", None)
  if dtype is None or not hasattr(leaf, "shape"):
    kind = type(leaf).__name__
    return "function" if callable(leaf) else kind
  if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return "PRNG key"
  if not jnp.issubdtype(dtype, jnp.floating):
    return f"{dtype} array"
  return None


def _linen_collection(tree: PyTree, path: tuple[Any, ...]) -> Optional[str]:
  """The linen collection ``path`` lies in, when it is not ``"params"``."""
  if not (isinstance(tree, Mapping) and "params" in tree and path):
    return None
  collection = layouts_lib.path_key(path[:1])[0]
  return None if collection == "params" else f"Flax collection {collection!r}"


def classify(tree: PyTree) -> list[Optional[str]]:
  """What every leaf of ``tree`` is, in ``jax.tree.leaves`` order.

  Returns:
    One entry per leaf: None for a weight, else what the leaf is (see
    :class:`SkippedLeaf`).
  """
  is_box = lambda node: _framework_node(node)[0]
  nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_box)[0]
  # A linen variables dict is told from an NNX state holding an attribute
  # named `params` by the Variables: an NNX state has them.
  linen = not any(is_box(node) for _, node in nodes)
  kinds = []
  for path, node in nodes:
    boxed, box_kind = _framework_node(node)
    for leaf in (jax.tree.leaves(node) if boxed else [node]):
      kind = box_kind or (linen and _linen_collection(tree, path)) or None
      kinds.append(kind or _leaf_kind(leaf))
  return kinds
