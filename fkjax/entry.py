"""What each entry point (train.py, eval.py, export.py, ``python -m
reproduce``, ``python -m reproduce.analysis``, benchmarks/gpu_bench.py) does
first, before its imports.

:func:`start` makes two things one line on stderr, at any moment from then
on, the entry point's own imports included (they run before
:func:`fkjax.cli.run`'s handler can):

* Ctrl-C: ``error: interrupted; ...``, exit 130 (:mod:`fkjax.interrupt`).
* A package of the ``[train]`` extra that is not installed:
  ``error: <package> is not installed: ... pip install 'fkjax[train]'``,
  exit 1 (:mod:`fkjax.extras`).

``--traceback`` or ``FKJAX_TRACEBACK=1`` shows the traceback instead. This
module imports nothing beyond the standard library and fkjax's dependency-free
modules; :func:`start` is for entry points (``if __name__ == "__main__"``),
never for a library.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

from fkjax import environment
from fkjax import extras
from fkjax import interrupt

__all__ = ["TRACEBACK_ENV", "show_traceback", "start"]

TRACEBACK_ENV = "FKJAX_TRACEBACK"
_TRACEBACK_ARGS = ("--traceback", "--traceback=true", "--traceback=1")
_previous_hook: Any = sys.__excepthook__


def show_traceback(argv: Sequence[str] = ()) -> bool:
  """Whether a traceback is asked for (``FKJAX_TRACEBACK``, or
  ``--traceback`` in ``argv``) instead of one line."""
  return (environment.enabled(TRACEBACK_ENV)
          or any(a in _TRACEBACK_ARGS for a in argv))


def start() -> None:
  """Ctrl-C and a missing ``[train]`` package end in one line (see the
  module docstring). Call it first, in the main module's
  ``if __name__ == "__main__":``."""
  global _previous_hook
  interrupt.install()
  if sys.excepthook is not _excepthook:
    _previous_hook, sys.excepthook = sys.excepthook, _excepthook


def _excepthook(kind: type[BaseException], exc: BaseException,
                tb: Any) -> None:
  line = None if show_traceback(sys.argv) else extras.missing_line(exc)
  if line is None:
    _previous_hook(kind, exc, tb)
    return
  print(f"error: {line}", file=sys.stderr, flush=True)
