"""Keeps orbax's noise off the user's screen where fkjax says it in one line.

Three kinds, each dropped only where fkjax's own message replaces it:

* log lines orbax writes and then acts on silently (a mid-epoch save without
  a metric; a step metadata file missing or not JSON): :func:`dropping`,
  around fkjax's own calls only, so importing fkjax leaves ``absl``'s logger
  as it was;
* the traceback each orbax worker thread logs when a write fails (a full
  disk gave ~1,000 lines): :func:`errors_held` holds them back, the caller
  drops them when it raises its one-line error, else they are replayed;
  the threads of a save abandoned (its one-line error, or Ctrl-C) go on
  logging after it, so :func:`drop_orbax_thread_errors` drops their
  reports from then on;
* the reports orbax's failed concurrent reads leave behind (pages of
  tensorstore internals): :func:`leftovers_dropped` around a read, and
  :func:`drop_orbax_leftovers` for good once one has failed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Any, Callable, Iterator

# Orbax warns on each save without a metric when it tracks the best; fkjax's
# mid-epoch saves carry none on purpose.
METRICLESS = ("did not provide metrics",)
# Orbax logs, then ignores, a step metadata file that is missing or not
# JSON; the restore refuses such a step in one line of its own.
METADATA_COMPLAINTS = ("Metadata file does not exist",
                       "Failed to json parse Metadata",
                       "Failed to read Metadata file")


def _absl() -> logging.Logger:
  return logging.getLogger("absl")


@contextlib.contextmanager
def dropping(texts: tuple[str, ...]) -> Iterator[None]:
  """Within the block, absl log records whose message contains one of
  ``texts`` are dropped."""
  def keep(record: logging.LogRecord) -> bool:
    return not any(text in str(record.msg) for text in texts)
  _absl().addFilter(keep)
  try:
    yield
  finally:
    _absl().removeFilter(keep)


@contextlib.contextmanager
def errors_held(orbax_only: bool = False
                ) -> Iterator[list[logging.LogRecord]]:
  """Holds back absl's records of level ERROR and above (``orbax_only``:
  orbax's) within the block and emits them after it, however it ends; the
  block drops them by clearing the list it is given."""
  held = []

  def hold(record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR or (
        orbax_only and not _from_orbax(record)):
      return True
    held.append(record)
    return False
  _absl().addFilter(hold)
  try:
    yield held
  finally:
    _absl().removeFilter(hold)
    for record in held:
      _absl().handle(record)


def drop_orbax_leftovers() -> Callable[[Any], Any] | None:
  """From now on, what orbax's failed reads report when their coroutines
  are collected (pages of tensorstore internals, some of them only after
  the restore has raised) or when they complete after it (a traceback of
  "Event loop is closed") is dropped: the restore's error says it in one
  line. Anything else goes to the hook in place before. Installed once, by
  the first restore that fails (importing fkjax, saving and restoring
  intact checkpoints change nothing); it stays, since the reports come at
  any moment after the error (without it, a truncated chunk's restore
  printed ~60 lines after its one-line error in 3 runs of 9). Returns the
  hook it replaced, None if it was in place already."""
  if _drops_leftovers(sys.unraisablehook):
    return None
  before = sys.unraisablehook

  def hook(unraisable):
    if not is_orbax_leftover(unraisable):
      before(unraisable)
  hook._fkjax_drops_orbax_leftovers = True
  sys.unraisablehook = hook
  return before


def _drops_leftovers(hook: Any) -> bool:
  return getattr(hook, "_fkjax_drops_orbax_leftovers", False)


@contextlib.contextmanager
def leftovers_dropped() -> Iterator[Callable[[], None]]:
  """Around an orbax read or write: its leftover reports are dropped from
  the start, since one can come before it has raised (a truncated chunk's
  restore printed a traceback of "Event loop is closed" above its one-line
  error once in a CI run; an asynchronous save's failed write prints them
  while the loop goes on). One that succeeds leaves nothing to drop, and
  the hook in place before is put back; after one that fails (an exception
  out of the block, or the ``keep()`` it yields called: an asynchronous
  save's failure is seen later, in its wait), the dropping stays
  (:func:`drop_orbax_leftovers`)."""
  before = drop_orbax_leftovers()
  kept = []
  yield lambda: kept.append(True)
  if before is not None and not kept and _drops_leftovers(
      sys.unraisablehook):
    sys.unraisablehook = before


def is_orbax_leftover(unraisable: Any) -> bool:
  """Whether an unraisable exception is what a failed orbax read leaves:
  its coroutine, collected, or the completion callback of a read that
  finished after the restore had raised and closed its event loop
  (tensorstore reports that one with no object, at any moment around the
  restore's error)."""
  code = getattr(unraisable.object, "cr_code", None)
  if code is not None:
    return "orbax" in code.co_filename
  if unraisable.object is not None or not (
      isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == "Event loop is closed"):
    return False
  tb = unraisable.exc_traceback
  while tb is not None:
    if tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
      return True
    tb = tb.tb_next
  return False


def _from_orbax(record: logging.LogRecord) -> bool:
  return f"{os.sep}orbax{os.sep}" in (record.pathname or "")


def drop_orbax_thread_errors() -> None:
  """From now on, the errors orbax logs (its worker threads' tracebacks)
  are dropped: a save was abandoned, said in one line, and its threads,
  left running, log their failures at any moment after (Ctrl-C during a
  save printed 45 lines after its one line, a full disk up to 446).
  Installed once; fkjax's own records and others' pass."""
  absl = _absl()
  if any(getattr(f, "_fkjax_drops_orbax_errors", False)
         for f in absl.filters):
    return

  def keep(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR or not _from_orbax(record)
  keep._fkjax_drops_orbax_errors = True
  absl.addFilter(keep)
  # The write's futures, collected later, report their failure once more
  # through asyncio's logger; its coroutines never run, and at exit the
  # interpreter warns of each (1 in about 15 runs with a file-size limit).
  logging.getLogger("asyncio").addFilter(_not_unretrieved)
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                          category=RuntimeWarning)


def _not_unretrieved(record: logging.LogRecord) -> bool:
  return "exception was never retrieved" not in str(record.msg)
