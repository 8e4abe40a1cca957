"""Every environment variable fkjax reads, declared and checked in one place.

A variable is a setting like a flag: the entry points check them all at
their start (:func:`check`), so that a wrong value is said in one line
naming the variable, before any work, instead of a traceback wherever it is
first read. The modules that read them use :func:`text` and
:func:`enabled`, so that a value means the same everywhere (``0`` and
``false`` turn a switch off wherever it is read).

This module imports nothing of fkjax or JAX; importing it changes nothing.
"""
from __future__ import annotations

import dataclasses
import os
import urllib.parse
from typing import Callable, Optional

__all__ = ["EnvironmentVariableError", "VARIABLES", "Variable", "check",
           "enabled", "text"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
PLATFORMS = ("cpu", "gpu", "tpu")
URL_SCHEMES = ("http", "https", "file", "ftp")

Problem = Optional[str]


class EnvironmentVariableError(RuntimeError):
  """An environment variable of fkjax holds a value it cannot use."""


def _switch(value: str) -> Problem:
  if value.strip().lower() in _TRUE + _FALSE:
    return None
  return "a switch: 1, true, yes or on; 0, false, no, off or empty"


def _platform(value: str) -> Problem:
  if value.strip().lower() in ("",) + PLATFORMS:
    return None
  return f"one of {', '.join(PLATFORMS)} (or unset: JAX's backend)"


def _folder(value: str) -> Problem:
  """A folder, existing or to be made: no file on its way."""
  node = os.path.abspath(value)
  while not os.path.isdir(node):
    if os.path.lexists(node):
      return (f"a folder, but {node} is a file" if node != os.path.abspath(
          value) else "a folder, not a file")
    node = os.path.dirname(node)
  return None


def _existing_folder(value: str) -> Problem:
  return None if os.path.isdir(value) else "an existing folder"


def _url(value: str) -> Problem:
  scheme = urllib.parse.urlsplit(value).scheme.lower()
  if scheme in URL_SCHEMES:
    return None
  return (f"a folder URL ({', '.join(s + '://' for s in URL_SCHEMES)}...) "
          "holding the CIFAR archives")


@dataclasses.dataclass(frozen=True)
class Variable:
  """One environment variable fkjax reads.

  Attributes:
    name: the variable.
    meaning: what it sets (for messages and docs).
    check: the problem with a non-empty value, or None where it is usable.
  """
  name: str
  meaning: str
  check: Callable[[str], Problem]


VARIABLES: tuple[Variable, ...] = (
    Variable("FKJAX_TRACEBACK", "show tracebacks instead of one line",
             _switch),
    Variable("FKJAX_ALLOW_UNVERIFIED_CHECKPOINT",
             "restore checkpoints whose digests cannot be read", _switch),
    Variable("FKJAX_NO_XLA_FLAGS", "leave XLA_FLAGS as the user set it",
             _switch),
    Variable("FKJAX_KERNELS_PLATFORM", "whose kernel selections apply",
             _platform),
    Variable("FKJAX_DATA_DIR", "where the datasets are", _folder),
    Variable("FKJAX_CIFAR_URL", "where the CIFAR archives are downloaded "
             "from", _url),
    Variable("FKJAX_ONEDNN_ROOT", "the oneDNN installation the CPU kernels "
             "build against", _existing_folder),
    Variable("FKJAX_ONEDNN_CACHE", "where the CPU kernels' library is "
             "built", _folder),
)
_BY_NAME = {v.name: v for v in VARIABLES}


def _declared(name: str) -> Variable:
  if name not in _BY_NAME:
    raise KeyError(f"{name} is not one of fkjax's environment variables "
                   "(fkjax.environment.VARIABLES)")
  return _BY_NAME[name]


def text(name: str) -> str:
  """The value of fkjax's variable ``name``, stripped ('' when unset)."""
  _declared(name)
  return os.environ.get(name, "").strip()


def enabled(name: str) -> bool:
  """Whether the switch ``name`` is on (``1``, ``true``, ``yes``, ``on``)."""
  return text(name).lower() in _TRUE


def check(environ: Optional[dict[str, str]] = None) -> None:
  """Raises :class:`EnvironmentVariableError` for the first of fkjax's variables
  that holds a value it cannot use, naming the variable and what it takes.
  """
  environ = os.environ if environ is None else environ
  for variable in VARIABLES:
    value = environ.get(variable.name, "").strip()
    if not value:
      continue
    problem = variable.check(value)
    if problem is not None:
      raise EnvironmentVariableError(
          f"environment variable {variable.name}={value!r} ({variable.meaning})"
          f" must be {problem}")
