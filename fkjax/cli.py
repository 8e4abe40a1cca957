"""What ``train.py``, ``eval.py`` and ``export.py`` share: a user error is
one line.

A mistake of the user's (a bad flag or config value, missing data, a missing,
corrupt or mismatching checkpoint, a diverged run, a workdir in use, a full
disk) prints ``error: <what, where, what to do>`` on stderr and exits with
status 2 (bad command line) or 1 (anything else), with no traceback.
``--traceback`` (or ``FKJAX_TRACEBACK=1``) shows the traceback instead, for
debugging; an unexpected exception (a bug) always shows it.
"""
from __future__ import annotations

import errno
import os
import sys
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

TRACEBACK_ENV = "FKJAX_TRACEBACK"

flags.DEFINE_bool("traceback", False,
                  "Show the Python traceback of an error instead of one line "
                  f"(also {TRACEBACK_ENV}=1).")


def show_traceback(argv: Sequence[str] = ()) -> bool:
  if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
    return True
  return any(a in ("--traceback", "--traceback=true", "--traceback=1")
             for a in argv)


def user_error_types() -> tuple[type[BaseException], ...]:
  """The exception types that mean a mistake of the user's, not a bug."""
  # Imported here: the entry points must not import JAX before parsing flags.
  from fkjax import checkpoint  # pylint: disable=import-outside-toplevel
  from fkjax import data  # pylint: disable=import-outside-toplevel
  from fkjax import run_config  # pylint: disable=import-outside-toplevel
  from fkjax import errors  # pylint: disable=import-outside-toplevel
  from fkjax import workdir  # pylint: disable=import-outside-toplevel
  return (run_config.ConfigError, data.DataError, checkpoint.CheckpointError,
          errors.TrainingError, workdir.WorkdirError)


def one_line(exc: BaseException) -> str:
  """``exc``'s message on one line (its type's name where it has none)."""
  text = " ".join(str(exc).split())
  return text or type(exc).__name__


def is_user_error(exc: BaseException) -> bool:
  """Whether ``exc`` is said in one line: a user's mistake
  (:func:`user_error_types`), unless ``FKJAX_TRACEBACK`` asks for the
  traceback."""
  return not show_traceback() and isinstance(exc, user_error_types())


def fail(message: str, code: int = 1) -> None:
  """Prints ``error: message`` (one line) and exits with ``code``."""
  print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
  sys.exit(code)


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    # absl's flag errors, and the config file's or an override's own errors
    # (ml_collections raises ValueError, KeyError, AttributeError, ...).
    if show_traceback(argv):
      raise
    if not isinstance(e, flags.Error):
      fail(f"bad command line: {type(e).__name__}: {e} (see --helpshort)",
           code=2)
    # A config file's own error (e.g. an unknown preset) arrives as the text
    # of its traceback; its last line says what is wrong.
    lines = [l for l in str(e).splitlines() if l.strip()]
    cause = lines[-1].strip() if lines else str(e)
    if "Traceback" in str(e) and ":" in cause:
      cause = cause.split(":", 1)[1].strip()
    fail(f"{cause} (see --helpshort)", code=2)
  return []  # not reached


def loaded_config(config: Any) -> Any:
  """``config`` (a config flag's value), or one line if its file failed."""
  if type(config).__name__ == "_ErrorConfig":   # ml_collections' stand-in
    error = object.__getattribute__(config, "_error")
    fail(f"cannot load the config file: {error}", code=2)
  return config


def run_config_for_eval(argv: Sequence[str], workdir: str,
                        config_flag: flags.Flag) -> Any:
  """What eval.py and export.py act on: the run's ``config.json`` with the
  command line's ``--config.*`` overrides (``config_flag``), validated.

  Also sets fkjax's XLA flags (before JAX starts its backend) and absl's
  logging to WARNING (orbax logs every file it writes at INFO; fkjax prints
  its own progress). Stray arguments and bad configs end in one line.
  """
  if len(argv) > 1:
    fail(f"unexpected arguments: {list(argv[1:])} (flags take the form "
         "--name=value)", code=2)
  # pylint: disable=import-outside-toplevel
  from absl import logging
  from ml_collections import config_flags
  from fkjax import kernels
  from fkjax import run_config
  config = run_config.config_for_eval(
      workdir, loaded_config(config_flag.value),
      config_flags.get_override_values(config_flag),
      config_given=config_flag.present)
  run_config.validate(config)
  kernels.apply_xla_flags()
  logging.set_verbosity(logging.WARNING)
  return config


def _guarded(main: Callable[[list[str]], Any], argv: list[str]) -> Any:
  try:
    return main(argv)
  except KeyboardInterrupt:
    fail("interrupted; rerun the same command to resume from the last "
         "checkpoint", code=130)
  except OSError as e:
    if flags.FLAGS.traceback or show_traceback():
      raise
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      fail(f"no space left on device ({e.filename or 'a write'}): free some "
           "space and rerun the same command to resume")
    if e.errno in (errno.EACCES, errno.EROFS, errno.ENOENT):
      fail(f"{e.strerror}: {e.filename}")
    raise
  except Exception as e:  # pylint: disable=broad-except
    if flags.FLAGS.traceback:
      raise
    if is_user_error(e):
      fail(one_line(e))
    raise
  return None


def run(main: Callable[[list[str]], Any]) -> None:
  """``absl.app.run(main)`` with one-line errors (see the module docstring)."""
  app.run(lambda argv: _guarded(main, argv), flags_parser=_parse_flags)
