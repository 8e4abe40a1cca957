"""A run's directory: its lock, its results files and what they record.

* :mod:`~fkjax.workdir.check`: ``check_workdir(path)`` refuses, in one line,
  a path that cannot be a workdir (an existing file); ``WorkdirError``.
* :mod:`~fkjax.workdir.lock`: ``WorkdirLock``, one training process at a
  time (any number of evaluations with ``shared=True``).
* :mod:`~fkjax.workdir.results`: the results files' names
  (``result_path``, ``eval_result_path``), ``write_results``, whole or
  not at all, ``read_results``, and ``results_lock`` for a merge.
* :mod:`~fkjax.workdir.metadata`: what produced a result (config, fkjax
  version, git commit, checkpoint step, data, UTC date).
* :mod:`~fkjax.workdir.per_image`: which test images each attack left
  correctly classified, as short text (``encode_correct``).
"""
from fkjax.workdir.check import WorkdirError
from fkjax.workdir.check import check_workdir
from fkjax.workdir.lock import LOCK_NAME
from fkjax.workdir.lock import WorkdirLock
from fkjax.workdir.metadata import results_metadata
from fkjax.workdir.metadata import source_version
from fkjax.workdir.per_image import CORRECT_ENCODING
from fkjax.workdir.per_image import decode_correct
from fkjax.workdir.per_image import encode_correct
from fkjax.workdir.results import FINAL
from fkjax.workdir.results import adopt_subset_result
from fkjax.workdir.results import eval_result_path
from fkjax.workdir.results import existing_eval_result
from fkjax.workdir.results import read_results
from fkjax.workdir.results import result_path
from fkjax.workdir.results import results_lock
from fkjax.workdir.results import write_results

__all__ = [
    "CORRECT_ENCODING", "FINAL", "LOCK_NAME", "WorkdirError", "WorkdirLock",
    "adopt_subset_result", "check_workdir", "decode_correct",
    "encode_correct", "eval_result_path", "existing_eval_result",
    "read_results", "result_path", "results_lock", "results_metadata",
    "source_version", "write_results",
]
