"""An orbax write that fails, or is cut short, ends in one line.

Orbax writes with worker threads. When a write fails (a full disk), each
thread logs its traceback and tensorstore's callbacks report "Event loop is
closed"; when Ctrl-C cuts a write short, the threads go on, log their
complaints after the one-line error (45 lines), and one still writing when
the interpreter exits can abort the process in tensorstore's C++.
:func:`one_line` around a write (a checkpoint's save, ``export.py``'s
variables) turns an I/O failure into the caller's one-line error, and on
Ctrl-C waits for the write's threads and drops their reports, so that the
command line's one line is all a user sees.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from fkjax.checkpoint import errors
from fkjax.checkpoint import quiet

# How long a write cut short waits for its threads.
ABANDON_SECONDS = 30.0


def _join_new(threads: set[threading.Thread], seconds: float) -> None:
  """Waits up to ``seconds`` for the threads not in ``threads`` to end
  (one thread of a write starts the next as it ends)."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    running = set(threading.enumerate()) - threads
    if not running:
      return
    for thread in running:
      thread.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def one_line(io_error: Callable[[OSError], Exception],
             wait: Callable[[], None] | None = None) -> Iterator[None]:
  """Within the block, an orbax write: an exception whose cause is an
  ``OSError`` (:func:`fkjax.checkpoint.errors.os_error`) is raised as
  ``io_error(cause)``, and on Ctrl-C (any ``BaseException``) the write's
  threads are waited for (``wait()``, e.g. the manager's
  ``wait_until_finished``, then every thread the block started). Either
  way orbax's reports of the failure are dropped; any other exception
  passes with them."""
  threads = set(threading.enumerate())
  with quiet.errors_held() as held, quiet.leftovers_dropped():
    try:
      yield
    except Exception as e:  # orbax wraps I/O errors in many types
      cause = errors.os_error(e)
      if cause is None:  # not an I/O failure: orbax's own logs are shown
        raise
      held.clear()  # the one line says it
      quiet.drop_orbax_thread_errors()
      raise io_error(cause) from e
    except BaseException:
      held.clear()
      quiet.drop_orbax_thread_errors()
      if wait is not None:
        try:
          wait()
        except Exception:  # pylint: disable=broad-except
          pass  # the write's own failure, not news
      _join_new(threads, ABANDON_SECONDS)
      raise
