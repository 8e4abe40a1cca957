"""The ``[train]`` extra: what it installs, and the line that says so when
one of its packages is missing.

``pip install fkjax`` is the library; the training side (fkjax.training,
.evaluation, .data, .config, .workdir, .cli, .pretrained, and the
repository's tools) imports packages that only ``pip install 'fkjax[train]'``
installs. :func:`missing_line` turns the ``ModuleNotFoundError`` of one of
them into one line saying what to install; the entry points say it
(:mod:`fkjax.entry`, :func:`fkjax.cli.guard`).

This module imports nothing of fkjax's or JAX's; importing it changes
nothing.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["INSTALL", "TRAIN", "missing", "missing_line"]

INSTALL = "pip install 'fkjax[train]'"
# The [train] extra of pyproject.toml (tests/test_install.py checks that
# they are the same): the name a module is imported by -> its distribution.
TRAIN: dict[str, str] = {
    "ml_collections": "ml-collections",
    "tqdm": "tqdm",
    "absl": "absl-py",
    "tensorboardX": "tensorboardX",
    "matplotlib": "matplotlib",
}


def missing(exc: BaseException) -> Optional[str]:
  """The distribution of the ``[train]`` extra whose import raised ``exc``
  (or an exception ``exc`` was raised from, or while handling), else
  None."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, ModuleNotFoundError) and exc.name:
      top = exc.name.split(".")[0]
      if top in TRAIN:
        return TRAIN[top]
    exc = exc.__cause__ or exc.__context__
  return None


def missing_line(exc: BaseException) -> Optional[str]:
  """What to say for ``exc`` (no ``error:``), where it is a missing package
  of the ``[train]`` extra; else None."""
  dist = missing(exc)
  if dist is None:
    return None
  return (f"{dist} is not installed: fkjax's training side needs the "
          f"[train] extra: {INSTALL}")
