"""Dotted config keys (``"training.batch_size"``): read and set in one place.

Configs are ``ml_collections.ConfigDict`` trees (or plain dicts of them, as
read back from a run's ``config.json``); users and sweeps name a leaf by its
dotted path, as on the command line (``--config.training.batch_size=64``).
"""
from __future__ import annotations

from typing import Any, Mapping

import ml_collections

__all__ = ["get", "has", "set_value"]

_MISSING = object()


def get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
  """``config.<dotted>``, or ``default`` where any part of the path is absent.

  A value of ``None`` stored at the key is returned as ``None``.
  """
  node: Any = config
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, Mapping)) or \
        part not in node:
      return default
    node = node[part]
  return node


def has(config: Mapping[str, Any], dotted: str) -> bool:
  """Whether ``config`` has the key ``dotted`` (a section or a leaf)."""
  return get(config, dotted, _MISSING) is not _MISSING


def set_value(config: ml_collections.ConfigDict, dotted: str, value: Any, *,
              must_exist: bool = False) -> None:
  """Sets ``config.<dotted>`` to ``value`` of any type (a tracer, say).

  Args:
    config: the config to change in place.
    dotted: the key, e.g. ``"training.batch_size"``.
    value: the new value; its type need not match the old one's.
    must_exist: a key not in ``config`` is a ``KeyError`` (a typo is an
      error); otherwise missing sections and the leaf are created.
  """
  *parents, leaf = dotted.split(".")
  node = config
  for part in parents:
    if part not in node:
      if must_exist:
        raise KeyError(f"config has no section {part!r} (key {dotted!r})")
      node[part] = ml_collections.ConfigDict()
    node = node[part]
  if leaf not in node:
    if must_exist:
      raise KeyError(f"config has no key {dotted!r}")
    if not _converted_on_assignment(value):
      # A new leaf has no type to check: the plain assignment stores the same
      # value as one under ignore_type(), whose walk over the whole section
      # (every key's characters included) made building a config from its
      # ~90 defaults cost ~40 ms.
      node[leaf] = value
      return
  elif _stored_as_is(node, leaf, value):
    # The type-checked assignment of a value of the old one's own type
    # stores it unchanged, as ignore_type() would, without that walk
    # (planning a table's runs sets ~2,000 keys a run).
    node[leaf] = value
    return
  with node.ignore_type():
    node[leaf] = value


def _stored_as_is(node: ml_collections.ConfigDict, leaf: str,
                  value: Any) -> bool:
  """Whether ``node[leaf] = value`` stores ``value`` itself under type
  safety: the old value is a plain leaf (not a reference, not a section)
  of exactly ``value``'s type, and ``value`` is not converted."""
  old = node[leaf] if not isinstance(node, ml_collections.ConfigDict) else (
      node._fields[leaf])  # pylint: disable=protected-access
  return (type(old) is type(value)
          and not isinstance(old, (ml_collections.FieldReference,
                                   ml_collections.ConfigDict))
          and not _converted_on_assignment(value))


def _converted_on_assignment(value: Any) -> bool:
  """Whether ConfigDict turns ``value`` into a ConfigDict of the parent's
  type safety when it is assigned (a dict, or a reference to one)."""
  if isinstance(value, ml_collections.FieldReference):
    value = None if value.empty() else value.get()
  return isinstance(value, (dict, ml_collections.FrozenConfigDict))
