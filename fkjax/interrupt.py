"""Ctrl-C at any moment ends a command in one line and exit status 130.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be
when SIGINT arrives: inside an import (a traceback), inside a callback that
the interpreter calls itself (JAX's ``_xla_gc_callback``, a ``__del__``:
"Exception ignored in ...", and the run goes on), or while orbax's threads
write (their complaints, and asyncio's at interpreter exit, come after the
command's own line). :func:`install`, the first thing each entry point
does, replaces that with one mechanism:

* Outside :func:`raising` (imports, flag parsing, the end of a command)
  nothing needs to be kept consistent: Ctrl-C writes the line and ends the
  process at once.
* Inside :func:`raising` (the command's work) Ctrl-C raises
  ``KeyboardInterrupt`` in the main thread, so that what is open closes as
  it does on any error (a checkpoint save is finished or abandoned as
  orbax's atomic rename allows, a lock is released), and the entry point's
  handler calls :func:`finish`. Everything written to stderr meanwhile
  (threads' complaints) is dropped: the line is all a user sees.
* An interrupt that the interpreter swallowed ("Exception ignored in", as
  in a garbage-collector callback) is delivered again, until it lands in
  code that can stop.
* A second Ctrl-C ends the process at once, as ``kill`` would (what fkjax
  writes survives that: atomic files, orbax's temporary checkpoints).

:func:`finish` ends the process with ``os._exit(130)`` after writing the
line: the interpreter's teardown, which reports the half-closed event loops
of orbax's threads, never runs.

Importing this module changes nothing; :func:`install` is for entry points
(``if __name__ == "__main__"``), never for a library.
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any, Iterator, NoReturn

__all__ = ["EXIT_CODE", "INTERRUPTED", "check", "configure", "finish",
           "install", "installed", "raising", "requested"]

EXIT_CODE = 130   # 128 + SIGINT, as a shell reports a process Ctrl-C ended
# The line of train.py, eval.py and export.py (a save cut short leaves the
# previous checkpoints intact: fkjax.checkpoint).
INTERRUPTED = ("interrupted; rerun the same command to resume: training from "
               "its last checkpoint, to the same parameters as an "
               "uninterrupted run; an evaluation at its next batch")


class _State:
  """The process's one interrupt state (entry points are one per process)."""
  line = f"error: {INTERRUPTED}"
  installed = False
  raising = 0            # depth of raising() blocks
  requested = False      # a Ctrl-C has arrived
  redeliver = False      # the raised KeyboardInterrupt was swallowed
  quiet = True           # drop stderr once interrupted (not with --traceback)
  stderr_fd: int | None = None   # the real stderr, kept for the line
  previous_unraisablehook: Any = None


def install(message: str = INTERRUPTED, *, quiet: bool = True) -> None:
  """Makes Ctrl-C end this process in ``error: message`` and exit 130.

  Call it in the main thread, before the entry point's heavy imports. A
  SIGINT that the parent set to be ignored (``nohup``, ``&`` in a script)
  stays ignored. SIGINT is unblocked: a Ctrl-C that a parent held back while
  the interpreter started is delivered here, where it is handled. Calling it
  again changes the line (and ``quiet``).

  Args:
    message: what the one line on stderr says after ``error:``.
    quiet: whether stderr is dropped from the Ctrl-C until the line (False:
      a ``--traceback`` run shows everything, and the ``KeyboardInterrupt``
      traceback).
  """
  configure(message, quiet=quiet)
  if _State.installed or threading.current_thread() is not \
      threading.main_thread():
    return
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    return
  _State.installed = True
  signal.signal(signal.SIGINT, _on_sigint)
  _State.previous_unraisablehook = sys.unraisablehook
  sys.unraisablehook = _unraisable
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def configure(message: str = INTERRUPTED, *, quiet: bool = True) -> None:
  """Sets what :func:`install`'s handler says (as its arguments), without
  taking over SIGINT."""
  _State.line, _State.quiet = f"error: {message}", quiet


def installed() -> bool:
  """Whether :func:`install` took over SIGINT in this process."""
  return _State.installed


def requested() -> bool:
  """Whether a Ctrl-C has arrived (an exception that follows is its)."""
  return _State.requested


@contextlib.contextmanager
def raising() -> Iterator[None]:
  """Within the block, Ctrl-C raises ``KeyboardInterrupt`` (the command's
  work, whose open files, saves and locks must close); outside it, Ctrl-C
  ends the process at once."""
  _State.raising += 1
  try:
    yield
  finally:
    _State.raising -= 1


def check() -> None:
  """Raises ``KeyboardInterrupt`` if a Ctrl-C has arrived: a safe point in a
  loop, for an interrupt that library code caught and dropped."""
  if _State.requested and _State.raising:
    raise KeyboardInterrupt


def finish() -> NoReturn:
  """Writes the line to stderr and ends the process with status 130,
  skipping the interpreter's teardown."""
  with contextlib.suppress(Exception):
    sys.stdout.flush()
  fd = _State.stderr_fd if _State.stderr_fd is not None else 2
  with contextlib.suppress(OSError):
    os.write(fd, (" ".join(_State.line.split()) + "\n").encode())
  os._exit(EXIT_CODE)  # pylint: disable=protected-access


def _silence_stderr() -> None:
  """Points stderr (fd 2, and Python's) at /dev/null, keeping the real one
  for :func:`finish`'s line."""
  if not _State.quiet or _State.stderr_fd is not None:
    return
  try:
    with contextlib.suppress(Exception):
      sys.stderr.flush()
    _State.stderr_fd = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
  except OSError:
    pass   # stderr stays as it was: noisier, not wrong


def _importing(frame: Any) -> bool:
  """Whether ``frame`` is inside an import."""
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib"):
      return True
    frame = frame.f_back
  return False


def _on_sigint(signum: int, frame: Any) -> None:
  del signum
  if _State.redeliver:
    # The previous KeyboardInterrupt was swallowed where it was raised.
    if frame is not None and frame.f_code is _unraisable.__code__:
      _redeliver_later()   # still in the hook that saw it swallowed
      return
    _State.redeliver = False
    raise KeyboardInterrupt
  if _State.requested or not _State.raising or _importing(frame):
    # A second Ctrl-C, nothing open to close, or a module half imported
    # (unwinding through a C extension's initialisation can crash).
    finish()
  _State.requested = True
  _silence_stderr()
  raise KeyboardInterrupt


def _redeliver_later() -> None:
  """SIGINT for the main thread, from another thread a moment later: marked
  as arrived in the hook itself, its handler would run at the hook's next
  instruction, inside the callback, and be swallowed again. Where it lands
  in another such callback, :func:`_unraisable` sends it once more."""
  def deliver() -> None:
    time.sleep(0.01)
    _thread.interrupt_main(signal.SIGINT)
  _thread.start_new_thread(deliver, ())


def _unraisable(unraisable: Any) -> None:
  """``sys.unraisablehook``: a ``KeyboardInterrupt`` raised where the
  interpreter can only report it (a gc callback, a ``__del__``) is raised
  again in the main thread at its next instruction."""
  if (_State.requested and unraisable.exc_type is not None
      and issubclass(unraisable.exc_type, KeyboardInterrupt)):
    _State.redeliver = True
    _redeliver_later()
    return
  _State.previous_unraisablehook(unraisable)
