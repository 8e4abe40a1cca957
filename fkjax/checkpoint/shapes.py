"""Whether a checkpoint holds the arrays of the config's state, said plainly.

Orbax restores into the template's structure and refuses other shapes, but
in words about its own options (``strict=False``, padding) and, for shapes,
only after its concurrent reads have started: the reads that fail after the
first leave asyncio tracebacks on stderr after the error. Other dtypes it
does not refuse: it casts to the template's, and the digests then call the
checkpoint corrupt. So shapes and dtypes are compared from orbax's metadata
before any read, and arrays one side lacks are named when orbax's restore
fails.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import orbax.checkpoint as ocp

from fkjax.checkpoint.errors import CheckpointError


class Leaf(NamedTuple):
  """An array's shape and dtype (None where its metadata has none)."""
  shape: tuple[int, ...]
  dtype: np.dtype | None


Arrays = dict[tuple[str, ...], Leaf]

_ANOTHER_CONFIG = "was it written with another config?"


def of_tree(tree: Any) -> Arrays:
  """``{path: Leaf(shape, dtype)}`` of a tree's array leaves; a state and
  the metadata orbax keeps of it give the same paths."""
  return {tuple(str(k) for k in path): Leaf(tuple(leaf.shape), _dtype(leaf))
          for path, leaf in ocp.tree.to_flat_dict(tree).items()
          if getattr(leaf, "shape", None) is not None}


def _dtype(leaf: Any) -> np.dtype | None:
  dtype = getattr(leaf, "dtype", None)
  return None if dtype is None else np.dtype(dtype)


def stored(manager: ocp.CheckpointManager, step: int) -> Arrays | None:
  """The checkpoint's ``{path: Leaf}`` from its metadata (None: unreadable,
  and the restore decides)."""
  try:
    return of_tree(manager.metadata(step).item_metadata.tree)
  except Exception:  # pylint: disable=broad-except
    return None


def check(want: Arrays, saved: Arrays | None, where: str) -> None:
  """Refuses, before orbax reads an array, a checkpoint whose arrays have
  other shapes or dtypes than the config's state (``want``); shapes are
  named first.

  Where the metadata cannot be read or names other arrays, the restore
  itself decides (and :func:`other_arrays` explains).
  """
  if saved is None or set(saved) != set(want):
    return
  for what, differs in (
      ("shape", lambda k: saved[k].shape != want[k].shape),
      ("dtype", lambda k: None not in (saved[k].dtype, want[k].dtype)
       and saved[k].dtype != want[k].dtype)):
    differ = [k for k in want if differs(k)]
    if differ:
      first = differ[0]
      raise CheckpointError(
          f"checkpoint {where} does not match the config's model/optimizer: "
          f"{'/'.join(first)} has {what} {getattr(saved[first], what)} "
          f"there and {getattr(want[first], what)} in the config"
          + (f" ({len(differ) - 1} more arrays differ)" if len(differ) > 1
             else "")
          + f"; {_ANOTHER_CONFIG}")


def other_arrays(want: Arrays, saved: Arrays | None,
                 where: str) -> CheckpointError | None:
  """The error naming what the checkpoint (``saved``) has that the
  config's state (``want``) lacks and the reverse (None if the same
  arrays, or unknown)."""
  if saved is None:
    return None
  parts = []
  for keys, says in ((sorted(set(want) - set(saved)),
                      "the config has {} that the checkpoint lacks"),
                     (sorted(set(saved) - set(want)),
                      "the checkpoint has {} that the config lacks")):
    if keys:
      more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
      parts.append(says.format("/".join(keys[0]) + more))
  if not parts:
    return None
  return CheckpointError(
      f"checkpoint {where} does not match the config's model/optimizer: "
      f"{'; '.join(parts)}; {_ANOTHER_CONFIG}")
