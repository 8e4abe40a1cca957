"""What ``train.py``, ``eval.py`` and ``export.py`` share: a user error is
one line.

A mistake of the user's (a bad flag or config value, missing data, a missing,
corrupt or mismatching checkpoint, a diverged run, a workdir in use, a full
disk, a batch too large for memory) prints ``error: <what, where, what to do>`` on stderr and exits with
status 2 (bad command line) or 1 (anything else), with no traceback.
``--traceback`` (or ``FKJAX_TRACEBACK=1``) shows the traceback instead, for
debugging; an unexpected exception (a bug) always shows it.
"""
from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

from fkjax import entry
from fkjax import environment
from fkjax import extras
from fkjax import interrupt
from fkjax import oserrors

TRACEBACK_ENV = entry.TRACEBACK_ENV
# Ctrl-C's line.
INTERRUPTED = interrupt.INTERRUPTED

flags.DEFINE_bool("traceback", False,
                  "Show the Python traceback of an error instead of one line "
                  f"(also {TRACEBACK_ENV}=1).")
# The same name and variable as fkjax.checkpoint's (not imported here: the
# entry points must not import JAX before parsing flags).
ALLOW_UNVERIFIED_ENV = "FKJAX_ALLOW_UNVERIFIED_CHECKPOINT"
flags.DEFINE_bool("allow_unverified_checkpoint", False,
                  "Restore a checkpoint whose digests cannot be read (its "
                  "metadata deleted or damaged), so that damaged or altered "
                  "arrays go unnoticed; without it such a checkpoint is "
                  f"refused (also {ALLOW_UNVERIFIED_ENV}=1).")


show_traceback = entry.show_traceback


# The exception types that mean a mistake of the user's, not a bug: module ->
# class name.
USER_ERRORS = {
    "fkjax.config.record": "ConfigError",
    "fkjax.data.types": "DataError",
    "fkjax.checkpoint": "CheckpointError",
    "fkjax.errors": "TrainingError",
    "fkjax.workdir.check": "WorkdirError",
    "fkjax.evaluation.memory": "BatchTooLarge",
    "fkjax.oserrors": "PathError",
    "fkjax.environment": "EnvironmentVariableError",
    "fkjax.readback": "DamagedFileError",
}


def user_error_types() -> tuple[type[BaseException], ...]:
  """The exception types of :data:`USER_ERRORS` that can have been raised.

  Only those of modules already imported: a module never imported raised
  nothing. (Importing them all, fkjax.checkpoint's JAX and orbax among them,
  took seconds before a bad config value's one line.)
  """
  return tuple(getattr(sys.modules[module], name)
               for module, name in USER_ERRORS.items()
               if module in sys.modules)


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


# absl's flags that print help and exit (with status 1: a help asked for is
# no failure, so it exits 0 here).
_HELP_FLAGS = ("help", "h", "?", "helpshort", "helpfull", "helpxml")


def _asks_for_help(argv: Sequence[str]) -> bool:
  return any(a.split("=", 1)[0].lstrip("-") in _HELP_FLAGS
             for a in argv[1:] if a.startswith("-"))


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except SystemExit as e:
    if _asks_for_help(argv):
      sys.exit(0)
    raise
  except Exception as e:  # pylint: disable=broad-except
    # absl's flag errors, and the config file's or an override's own errors
    # (ml_collections raises ValueError, KeyError, AttributeError, ...).
    if show_traceback(argv):
      raise
    if not isinstance(e, flags.Error):
      # ml_collections says an override's path is wrong as a KeyError, an
      # AttributeError or a ValueError whose text names neither the flag
      # nor the fields there are. (A default config file's overrides fail
      # earlier, in define_config_file.)
      _bad_override(argv, e, None)
    # A config file's own error (e.g. an unknown preset) arrives as the text
    # of its traceback; its last line says what is wrong.
    lines = [l for l in str(e).splitlines() if l.strip()]
    cause = lines[-1].strip() if lines else str(e)
    if "Traceback" in str(e) and ":" in cause:
      cause = cause.split(":", 1)[1].strip()
    # absl words a bad boolean as the repr of its error's arguments.
    cause = re.sub(r"\('Non-boolean argument to boolean flag', (.*)\)$",
                   r"\1 is not a boolean (true or false)", cause)
    fail(f"{cause} (see --helpshort)", code=2)
  return []  # not reached


def _config_file_arg(argv: Sequence[str],
                     default: str | None) -> str | None:
  """The ``--config=FILE[:presets]`` of ``argv``, else ``default``."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return default


def unknown_override_field(argv: Sequence[str],
                           default_config_file: str | None = None
                           ) -> str | None:
  """Which ``--config.a.b=v`` of ``argv`` names no field of the config file,
  said as ``--config.a.b: config.a has no field 'b'; did you mean
  config.a.c? (its fields: ...)``.

  The config file is ``argv``'s ``--config=``, else ``default_config_file``.
  Returns None where every override's path exists, or where the config file
  itself does not load (that has its own message).
  """
  # pylint: disable=import-outside-toplevel
  import ml_collections
  from ml_collections import config_flags
  spec = _config_file_arg(argv, default_config_file)
  overrides = [a[len("--config."):].split("=", 1)[0]
               for a in argv[1:] if a.startswith("--config.")]
  if spec is None or not overrides:
    return None
  loader = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=loader)
  # config_flags takes the overrides from sys.argv as well as from the
  # arguments it parses: the file alone is loaded with sys.argv set to it.
  argv_before, sys.argv = sys.argv, ["fkjax", f"--config={spec}"]
  try:
    loader(sys.argv)
  except Exception:  # pylint: disable=broad-except
    return None
  finally:
    sys.argv = argv_before
  config = loader["config"].value
  if not isinstance(config, ml_collections.ConfigDict):
    return None
  for path in overrides:
    problem = _missing_field(config, path)
    if problem is not None:
      return problem
  return None


def _missing_field(config: Any, path: str) -> str | None:
  """Where the dotted ``path`` leaves ``config``, and the fields there
  (None: ``config`` has ``path``)."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  node, where = config, "config"
  for name in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      return (f"--config.{path}: {where} is a value "
              f"({type(node).__name__}), not a section with fields")
    if name not in node:
      fields = sorted(node.keys())
      close = difflib.get_close_matches(name, fields, n=1)
      hint = f"; did you mean {where}.{close[0]}?" if close else ""
      return (f"--config.{path}: {where} has no field {name!r}{hint} "
              f"(its fields: {', '.join(fields)})")
    node, where = node[name], f"{where}.{name}"
  return None


def _bad_override(argv: Sequence[str], exc: BaseException,
                  default_config_file: str | None) -> None:
  """Ends a config override's error (not one of absl's) in one line."""
  problem = unknown_override_field(argv, default_config_file)
  fail(problem or f"bad command line: {type(exc).__name__}: {one_line(exc)} "
       "(see --helpshort)", code=2)


def define_config_file(name: str, default: str | None, help_string: str,
                       *, lock_config: bool) -> Any:
  """``config_flags.DEFINE_config_file``, with a bad override in one line.

  With a ``default`` file, config_flags loads it, and applies the command
  line's ``--config.*`` overrides, as the flag is defined, before
  :func:`run` parses anything: an override of a field the file lacks would
  otherwise end in a traceback at import.
  """
  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags
  try:
    return config_flags.DEFINE_config_file(name, default, help_string,
                                           lock_config=lock_config)
  except Exception as e:  # pylint: disable=broad-except
    if show_traceback(sys.argv):
      raise
    _bad_override(sys.argv, e, default)
  return None  # not reached


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
  from fkjax.config import record as run_config
  config = run_config.config_for_eval(
      workdir, loaded_config(config_flag.value),
      config_flags.get_override_values(config_flag),
      config_given=config_flag.present)
  run_config.validate(config)
  # Only now: fkjax.kernels imports JAX (seconds), which a refused
  # override needs no more than the rest of this check does.
  from fkjax import kernels
  kernels.apply_xla_flags()
  logging.set_verbosity(logging.WARNING)
  return config


def exit_code(e: SystemExit) -> int:
  """The status ``e`` exits with (as the interpreter reads ``e.code``)."""
  if e.code is None:
    return 0
  return e.code if isinstance(e.code, int) else 1


def exit(code: int) -> None:  # pylint: disable=redefined-builtin
  """Ends an entry point with ``code``. A failure ends without the
  interpreter's teardown, whose reports (orbax's half-closed event loops,
  "Exception ignored in ...") would follow the one error line; so does
  anything after Ctrl-C (:mod:`fkjax.interrupt`)."""
  if code == 0 or not interrupt.installed():
    sys.exit(code)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  os._exit(code)  # pylint: disable=protected-access


def error_line(exc: BaseException) -> str | None:
  """The one line that says ``exc``, or None where it is a bug (shown with
  its traceback): a user's mistake (:func:`is_user_error`), a package of
  the ``[train]`` extra not installed (:mod:`fkjax.extras`), or a system
  error on a path (:mod:`fkjax.oserrors`: the path, the flag that gave it,
  what to do)."""
  if show_traceback():
    return None
  if is_user_error(exc):
    return one_line(exc)
  if extras.missing(exc) is not None:
    return extras.missing_line(exc)
  cause = oserrors.os_error(exc)
  if cause is not None and oserrors.is_path_error(cause):
    return oserrors.describe(cause)
  return None


def guard(work: Callable[[], Any], *, interrupted: str = INTERRUPTED,
          traceback: bool = False) -> Any:
  """Runs an entry point's ``work()``: a user's mistake or a system error
  on a path ends in one line (exit 1), Ctrl-C in ``interrupted`` (exit
  130), at any moment (:mod:`fkjax.interrupt`); ``traceback``: show the
  traceback instead (a bug always shows it)."""
  traceback = traceback or show_traceback()
  interrupt.configure(interrupted, quiet=not traceback)
  try:
    with interrupt.raising():
      return work()
  except SystemExit:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    if isinstance(e, KeyboardInterrupt) or interrupt.requested():
      # Whatever it became on its way up (a library may wrap it).
      if traceback:
        raise
      if interrupt.installed():
        interrupt.finish()
      fail(interrupted, code=interrupt.EXIT_CODE)
    line = None if traceback else error_line(e)
    if line is None:
      raise
    fail(line)
  return None  # not reached


def check_environment() -> None:
  """Every environment variable of fkjax (:mod:`fkjax.environment`) holds a
  usable value, or one line (exit 2)."""
  try:
    environment.check()
  except environment.EnvironmentVariableError as e:
    fail(str(e), code=2)


def _guarded(main: Callable[[list[str]], Any], argv: list[str]) -> Any:
  if flags.FLAGS.allow_unverified_checkpoint:
    # Where fkjax.checkpoint.Checkpointer looks, however deep it is built.
    os.environ[ALLOW_UNVERIFIED_ENV] = "1"
  return guard(lambda: main(argv), traceback=flags.FLAGS.traceback)


def run(main: Callable[[list[str]], Any]) -> None:
  """``absl.app.run(main)`` with one-line errors (see the module docstring).

  Ctrl-C at any moment, imports included where the entry point called
  :func:`fkjax.interrupt.install` first, ends in one line and exit 130. A
  command that fails ends without the interpreter's teardown, whose reports
  of orbax's half-closed event loops would follow the one line.
  """
  interrupt.install(INTERRUPTED, quiet=not show_traceback(sys.argv))
  check_environment()
  try:
    app.run(lambda argv: _guarded(main, argv), flags_parser=_parse_flags)
  except SystemExit as e:
    exit(exit_code(e))
