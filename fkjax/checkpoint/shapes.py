"""Whether a checkpoint holds the arrays of the config's state, said plainly.

Orbax restores into the template's structure and refuses other shapes, but
in words about its own options (``strict=False``, padding) and, for shapes,
only after its concurrent reads have started: the reads that fail after the
first leave asyncio tracebacks on stderr after the error. So shapes are
compared from orbax's metadata before any read, and arrays one side lacks
are named when orbax's restore fails.
"""
from __future__ import annotations

from typing import Any

import orbax.checkpoint as ocp

from fkjax.checkpoint.errors import CheckpointError

Shapes = dict[tuple[str, ...], tuple[int, ...]]

_ANOTHER_CONFIG = "was it written with another config?"


def of_tree(tree: Any) -> Shapes:
  """``{path: shape}`` of a tree's array leaves; a state and the metadata
  orbax keeps of it give the same paths."""
  return {tuple(str(k) for k in path): tuple(leaf.shape)
          for path, leaf in ocp.tree.to_flat_dict(tree).items()
          if getattr(leaf, "shape", None) is not None}


def stored(manager: ocp.CheckpointManager, step: int) -> Shapes | None:
  """The checkpoint's ``{path: shape}`` from its metadata (None: unreadable,
  and the restore decides)."""
  try:
    return of_tree(manager.metadata(step).item_metadata.tree)
  except Exception:  # pylint: disable=broad-except
    return None


def check(want: Shapes, saved: Shapes | None, where: str) -> None:
  """Refuses, before orbax reads an array, a checkpoint whose arrays have
  other shapes than the config's state (``want``).

  Where the metadata cannot be read or names other arrays, the restore
  itself decides (and :func:`other_arrays` explains).
  """
  if saved is None or set(saved) != set(want):
    return
  differ = [k for k in want if saved[k] != want[k]]
  if differ:
    first = differ[0]
    raise CheckpointError(
        f"checkpoint {where} does not match the config's model/optimizer: "
        f"{'/'.join(first)} has shape {saved[first]} there and "
        f"{want[first]} in the config"
        + (f" ({len(differ) - 1} more arrays differ)" if len(differ) > 1
           else "")
        + f"; {_ANOTHER_CONFIG}")


def other_arrays(want: Shapes, saved: Shapes | None,
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
