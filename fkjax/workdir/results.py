"""A workdir's results files: their names, and writing them whole.

Every evaluation writes its own file, named by what produced it, so results
of different protocols never overwrite each other::

  result_path(workdir, "final")                 -> final_eval.json
  result_path(workdir, "paper")                 -> eval_paper.json
  result_path(workdir, "strong", eot=10)        -> eval_strong_eot10.json
  result_path(workdir, "paper", checkpoint="latest", eot=None)
                                                -> eval_paper_checkpointlatest.json
  result_path(workdir, "paper", n=50)           -> eval_paper_n50.json

``eval_result_path(workdir, config)`` names the file of the evaluation a run
config's ``eval`` section describes; an evaluation of the first N test images
only (``eval.num_examples=N``) says ``_n<N>``.

``final`` is train.py's short end-of-training evaluation; other protocols are
eval.py's. Settings are appended in sorted key order as ``_<key><value>``;
settings that are ``None`` or ``False`` are left out (pass ``None`` for a
default), ``True`` appends ``_<key>``. Running the same protocol with the
same settings again replaces its file with the new result.

``write_results(path, results, metadata)`` writes ``results`` plus a
``"metadata"`` entry (see :func:`fkjax.workdir.results_metadata`) whole or
not at all (:mod:`fkjax.atomic`): a crash or a full disk leaves the previous
file intact. An evaluation that merges its results into an earlier file
(``fkjax.evaluation.merge``) reads and writes it within
``results_lock(workdir)``, so that two evaluations side by side merge
rather than one replacing the other's; ``read_results(path)`` reads one.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
from typing import Any, Iterator, Mapping

from fkjax import atomic
from fkjax import readback
from fkjax.readback import NUMBER, MapOf
from fkjax.workdir.check import WorkdirError
from fkjax.workdir.metadata import jsonable

FINAL = "final"  # the protocol name of train.py's final evaluation
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# flock errnos that mean "not supported here".
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}

_SAFE = re.compile(r"[^A-Za-z0-9.+-]")

# What an evaluation's result file holds, as its readers use it (the
# strong protocol's has no "attacks"; a NaN accuracy is written as null).
RESULT_SHAPE = {"metadata?": {"config?": dict, "step?": int},
                "attacks?": MapOf({"accuracy": (NUMBER, type(None))}),
                "earlier?": list}


def result_path(workdir: str | os.PathLike[str], protocol: str,
                **settings: Any) -> str:
  """The results file of ``protocol`` with ``settings`` (see module doc)."""
  if not protocol or _SAFE.search(protocol):
    raise ValueError(f"protocol must be a non-empty word of letters, digits, "
                     f"'.', '+' or '-', not {protocol!r}")
  parts = []
  for key in sorted(settings):
    value = settings[key]
    if value is None or value is False:
      continue
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
      raise ValueError(f"setting names must be alphanumeric, not {key!r}")
    parts.append(key if value is True else key + _SAFE.sub("-", str(value)))
  stem = "final_eval" if protocol == FINAL else f"eval_{protocol}"
  return os.path.join(os.fspath(workdir), "_".join([stem, *parts]) + ".json")


def eval_result_path(workdir: str | os.PathLike[str], config: Any,
                     final: bool = False) -> str:
  """The results file of the evaluation ``config.eval`` describes (its
  protocol, the strong protocol's targeting, EOT draws, a subset's size),
  or of train.py's end-of-training evaluation if ``final``."""
  if final:
    return result_path(workdir, FINAL)
  return _eval_result_path(workdir, config,
                           n=config.eval.get("num_examples") or None)


def _eval_result_path(workdir, config, n: int | None) -> str:
  # n: the first n test images only (eval.num_examples), in the name so
  # that a subset's result never replaces, nor passes for, the whole set's.
  if config.eval.protocol == "strong":
    # APGD-T is the default: a run without it says so.
    return result_path(workdir, "strong",
                       untargeted=not config.eval.strong.targeted, n=n)
  eot = config.eval.eot_samples
  return result_path(workdir, config.eval.protocol,
                     eot=eot if eot > 1 else None, n=n)


def existing_eval_result(workdir: str | os.PathLike[str], config: Any
                         ) -> str | None:
  """The file that holds the result of the evaluation ``config`` describes:
  :func:`eval_result_path`, or the name fkjax gave a subset's result before
  subsets said ``_n<N>`` where what that file records is named
  :func:`eval_result_path` today (its ``eval.num_examples`` and, for the
  strong protocol, its targeting); None if neither holds it."""
  new = eval_result_path(workdir, config)
  if os.path.exists(new):
    return new
  if not config.eval.get("num_examples"):
    return None
  old = _eval_result_path(workdir, config, n=None)
  recorded = (read_results(old) or {}).get("metadata", {}).get("config")
  try:
    recorded_name = _eval_result_path(
        workdir, _Attributes(recorded),
        n=recorded["eval"].get("num_examples") or None)
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return None
  # An untargeted strong evaluation never passes for a targeted one.
  return old if recorded_name == new else None


class _Attributes(dict):
  """A recorded config (plain JSON data) read as ``config.eval.protocol``."""

  def __getattr__(self, name: str) -> Any:
    try:
      value = self[name]
    except KeyError as e:
      raise AttributeError(name) from e
    return _Attributes(value) if isinstance(value, dict) else value


def adopt_subset_result(workdir: str | os.PathLike[str], config: Any) -> bool:
  """Renames the result of ``config``'s subset evaluation that fkjax wrote
  under the whole test set's name (before subsets said ``_n<N>``) to its
  name now; True if it did. Only a file whose recorded settings are named
  so today moves (:func:`existing_eval_result`), and never over a file."""
  new = eval_result_path(workdir, config)
  found = existing_eval_result(workdir, config)
  if found is None or found == new:
    return False
  os.replace(found, new)
  return True


def _finite_or_none(value: Any) -> Any:
  """JSON has no NaN/inf: strict readers (jq, JavaScript) reject them."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite_or_none(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_finite_or_none(v) for v in value]
  return value


def write_results(path: str | os.PathLike[str], results: Mapping[str, Any],
                  metadata: Mapping[str, Any]) -> None:
  """Writes ``{**results, "metadata": metadata}`` to ``path`` atomically.

  Raises:
    ValueError: ``results`` has its own ``"metadata"`` entry.
    WorkdirError: the file cannot be written (e.g. the disk is full); the
      previous file, if any, is unchanged.
  """
  if "metadata" in results:
    raise ValueError("results must not have a 'metadata' entry")
  path = os.fspath(path)
  document = json.loads(json.dumps({**results, "metadata": dict(metadata)},
                                   default=jsonable))
  text = json.dumps(_finite_or_none(document), indent=2) + "\n"
  try:
    atomic.write_text(path, text)
  except OSError as e:
    if e.errno in _NO_SPACE:
      raise WorkdirError(
          f"no space left on device while writing {path}; free space and "
          "rerun (the previous file is unchanged)") from e
    raise WorkdirError(f"could not write {path}: {e.strerror or e}") from e


@contextlib.contextmanager
def results_lock(workdir: str | os.PathLike[str]) -> Iterator[None]:
  """Within the block, no other process is within a ``results_lock`` of
  ``workdir`` (it waits): for reading a results file and writing it back
  merged. The lock is on the directory itself, so no file is left behind;
  on a filesystem without ``flock`` it does nothing."""
  fd = os.open(os.fspath(workdir), os.O_RDONLY | os.O_CLOEXEC)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
      if e.errno not in _NO_FLOCK:
        raise
    yield
  finally:
    os.close(fd)   # releases the lock


def read_results(path: str | os.PathLike[str]) -> dict[str, Any] | None:
  """The results file at ``path`` as written, or None where there is none.

  Raises:
    fkjax.readback.DamagedFileError: it is not whole JSON or not a result
      file's shape (damaged or replaced outside fkjax): a merge must not
      take it for no file and write over it.
  """
  return readback.read_json(path, RESULT_SHAPE, what="evaluation results")
