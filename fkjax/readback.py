"""Reading back the JSON files fkjax and its tools wrote: one reader.

Every file a tool reads back (a run's ``config.json``, evaluation results,
checkpoint records, ``reproduce``'s run records and tables, a ``--speed-from``
measurement) is read by :func:`read_json`: it parses the file and checks its
shape, and a file that is not whole JSON or not of the expected shape (cut
short, edited, another tool's) raises :class:`DamagedFileError`, whose
message names the file on one line. A damaged file is never read as if it
were missing: that would silently change a table, a claim or a resume.

A shape is written as data:

* a type, or a tuple of types: ``isinstance`` (``NUMBER``: an int or a float,
  not a bool);
* a dict ``{key: shape}``: a JSON object that has each key, with a value of
  that shape; a key written ``"name?"`` may be absent (or null); other keys
  are allowed (newer writers add some);
* :class:`MapOf` / :class:`ListOf`: an object whose every value, a list whose
  every item, has the shape;
* ``object``: anything.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

__all__ = ["DamagedFileError", "ListOf", "MapOf", "NUMBER", "check",
           "ensure", "read_json"]


class DamagedFileError(Exception):
  """A file read back is not whole JSON, or not of its expected shape."""


@dataclasses.dataclass(frozen=True)
class MapOf:
  """A JSON object whose every value has ``shape``."""
  shape: Any


@dataclasses.dataclass(frozen=True)
class ListOf:
  """A JSON list whose every item has ``shape``."""
  shape: Any


class _Number:
  """An int or a float (JSON's number), not a bool."""


NUMBER = _Number

_NAMES = {dict: "an object", list: "a list", str: "a string",
          bool: "true or false", int: "an integer", float: "a number",
          _Number: "a number", type(None): "null"}


def _name(shape: Any) -> str:
  if isinstance(shape, tuple):
    return " or ".join(_name(s) for s in shape)
  if isinstance(shape, (dict, MapOf)):
    return "an object"
  if isinstance(shape, ListOf):
    return "a list"
  return _NAMES.get(shape, getattr(shape, "__name__", str(shape)))


def _is(value: Any, kind: type) -> bool:
  if kind is _Number or kind is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, kind)


def check(value: Any, shape: Any, where: str = "the file") -> str | None:
  """What is wrong with ``value`` against ``shape`` (None: nothing), e.g.
  ``"fingerprints.train is a list, not a string"``."""
  if shape is object:
    return None
  if isinstance(shape, dict):
    if not isinstance(value, dict):
      return f"{where} is {_name(type(value))}, not an object"
    for key, sub in shape.items():
      optional = key.endswith("?")
      key = key.rstrip("?")
      inner = key if where == "the file" else f"{where}.{key}"
      if key not in value or (optional and value[key] is None):
        if optional:
          continue
        return f"{inner} is missing"
      problem = check(value[key], sub, inner)
      if problem:
        return problem
    return None
  if isinstance(shape, MapOf):
    if not isinstance(value, dict):
      return f"{where} is {_name(type(value))}, not an object"
    for key, item in value.items():
      inner = key if where == "the file" else f"{where}.{key}"
      problem = check(item, shape.shape, inner)
      if problem:
        return problem
    return None
  if isinstance(shape, ListOf):
    if not isinstance(value, list):
      return f"{where} is {_name(type(value))}, not a list"
    for i, item in enumerate(value):
      problem = check(item, shape.shape, f"{where}[{i}]")
      if problem:
        return problem
    return None
  kinds = shape if isinstance(shape, tuple) else (shape,)
  if any(_is(value, k) for k in kinds):
    return None
  return f"{where} is {_name(type(value))}, not {_name(shape)}"


def read_json(path: str | os.PathLike[str], shape: Any = dict, *,
              what: str = "", missing_ok: bool = True) -> Any:
  """The JSON data in ``path``, checked against ``shape``.

  Args:
    path: the file.
    shape: what it must hold (see the module docstring); default: an object.
    what: what the file is, for the message (``"run record"``).
    missing_ok: return None for a missing file (else it raises
      ``FileNotFoundError``, an OS error the entry points say in one line).

  Raises:
    DamagedFileError: not whole JSON, or not of ``shape``: one line naming
      the file, what it should be and what to do.
  """
  path = os.fspath(path)
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except FileNotFoundError:
    if missing_ok:
      return None
    raise
  except IsADirectoryError as e:
    raise _damaged(path, what, "it is a directory") from e
  try:
    data = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    why = "empty" if not raw.strip() else f"not whole JSON ({e})"
    raise _damaged(path, what, why) from e
  problem = check(data, shape)
  if problem:
    raise _damaged(path, what, problem)
  return data


def ensure(data: Any, shape: Any, path: str | os.PathLike[str], *,
           what: str = "") -> Any:
  """``data`` (read from ``path``) where it has ``shape``, else
  :class:`DamagedFileError`: for a file whose shape depends on what it
  says it is."""
  problem = check(data, shape)
  if problem:
    raise _damaged(os.fspath(path), what, problem)
  return data


def _damaged(path: str, what: str, why: str) -> DamagedFileError:
  kind = f" as {what}" if what else ""
  return DamagedFileError(
      f"{path} cannot be read{kind}: {why}; it is damaged or not the file "
      "fkjax wrote there: restore it, or move it away to have it made "
      "again")
