"""Each array's SHA-256, saved with a checkpoint and compared on restore.

The digests go into orbax's per-step metadata file (``_CHECKPOINT_METADATA``,
written inside the step's temporary directory, so it is committed with the
arrays). Orbax checks no array's bytes: a chunk with flipped bytes can
restore as wrong values, which only the digests expose. Orbax also reads
past a metadata file that is missing or not JSON, which is why
:func:`read_saved` reads the file itself and says what is wrong with it.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import jax
import numpy as np

# Key of fkjax's entry in orbax's per-step custom metadata.
_METADATA_KEY = "fkjax"
_DIGEST_FORMAT = "sha256-v1"
# orbax's per-step metadata file, which holds the digests.
STEP_METADATA = "_CHECKPOINT_METADATA"


def _local_value(x: Any) -> np.ndarray | None:
  """The whole array on this host, or None where it is split across hosts."""
  if isinstance(x, jax.Array):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if not x.is_fully_addressable:
      if not x.sharding.is_fully_replicated:
        return None
      x = x.addressable_data(0)
  return np.ascontiguousarray(np.asarray(jax.device_get(x)))


def digests(state: Any) -> dict[str, str | None]:
  """``{leaf path: sha256 of dtype, shape and bytes}`` (None: not local)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    value = _local_value(leaf)
    if value is None:
      out[jax.tree_util.keystr(path)] = None
      continue
    h = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode())
    h.update(value.reshape(-1).view(np.uint8))
    out[jax.tree_util.keystr(path)] = h.hexdigest()
  return out


def custom_metadata(state: Any) -> dict[str, Any]:
  """What to save as orbax's ``custom_metadata`` with ``state``."""
  return {_METADATA_KEY: {"format": _DIGEST_FORMAT,
                          "digests": digests(state)}}


def read_saved(step_dir: str) -> tuple[str | None, dict[str, Any]]:
  """``(None, {leaf path: digest})`` from a step's metadata file, or
  ``(what is wrong, {})``."""
  path = os.path.join(step_dir, STEP_METADATA)
  try:
    with open(path, "rb") as f:
      text = f.read()
  except FileNotFoundError:
    return (f"its metadata file {path}, which holds the digests of its "
            "arrays, is missing (deleted?)"), {}
  except OSError as e:
    return f"its metadata file {path} is unreadable ({e.strerror})", {}
  try:
    metadata = json.loads(text)
  except ValueError as e:
    return (f"its metadata file {path}, which holds the digests of its "
            f"arrays, is not valid JSON ({' '.join(str(e).split())})"), {}
  entry = ((metadata.get("custom_metadata") or {}).get(_METADATA_KEY)
           if isinstance(metadata, dict) else None)
  if not (isinstance(entry, dict) and entry.get("format") == _DIGEST_FORMAT
          and isinstance(entry.get("digests"), dict)):
    return (f"its metadata file {path} holds no digests of its arrays "
            "(removed, or written by an fkjax from before digests)"), {}
  return None, entry["digests"]


def differing(saved: dict[str, Any], state: Any) -> list[str]:
  """The leaf paths whose digest in ``state`` is not the ``saved`` one,
  then those only one side has (paths split across hosts are skipped)."""
  got = digests(state)
  bad = [k for k in sorted(set(got) | set(saved))
         if got.get(k) is not None and saved.get(k) is not None
         and got[k] != saved[k]]
  return bad + sorted(set(got) ^ set(saved))


def nonfinite_leaves(state: Any) -> list[str]:
  """The paths of floating-point leaves holding a NaN or an infinity."""
  bad = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    if not jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
      continue
    shards = ([s.data for s in leaf.addressable_shards]
              if isinstance(leaf, jax.Array) else [leaf])
    if not all(np.all(np.isfinite(np.asarray(s))) for s in shards):
      bad.append(jax.tree_util.keystr(path))
  return bad
