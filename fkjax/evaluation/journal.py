"""An evaluation's finished batches, kept on disk so a killed one resumes.

An evaluation under strong attacks can outlast the process running it
(NAttack at the paper's budget, APGD with EOT on an ensemble: hours; a job
scheduler's time limit can end it sooner).
:class:`fkjax.evaluation.loop.Evaluator`, given a :class:`Journal`, writes
after every batch what it has counted so far: the
batches done, the images, per attack the images right, the seconds and
which images it left right; and, within a batch, after every attack, which
images the attacks finished so far left right (so a kill loses at most the
attack under way). Run again with the same identity (the
checkpoint, the attacks and their settings, the data, the key), it starts
after the last batch written: every batch draws its keys from
``fold_in(key, batch_index)``, so the result equals an uninterrupted run's.
Each identity has its own file (its name ends in a digest of the
identity): a killed evaluation under other settings keeps its batches,
resumed when it is run again, whatever ran in between. The file is written
atomically (``fkjax.workdir.write_results``), so a kill during a write
leaves the previous batch's.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import numpy as np

from fkjax import workdir as workdir_lib


# Where eval_run keeps a run's journals: <workdir>/eval_journal/.
JOURNAL_DIR = "eval_journal"


def batches_kept(workdir: str) -> int:
  """Batches the journals in ``workdir`` hold (0: no evaluation under way):
  for a status line, whatever evaluation they belong to."""
  folder = os.path.join(workdir, JOURNAL_DIR)
  total = 0
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
    if name.startswith("."):
      continue   # a write under way (fkjax.atomic's staging file)
    try:
      with open(os.path.join(folder, name)) as f:
        total += int(json.load(f)["batches_done"])
    except (OSError, ValueError, KeyError, TypeError):
      continue   # a temporary file mid-write, or not a journal
  return total


def _canonical(value: Mapping[str, Any]) -> Any:
  """``value`` as JSON reads it back (tuples as lists, keys as strings)."""
  return json.loads(json.dumps(value, sort_keys=True, default=str))


class Journal:
  """The batches an evaluation has finished, in one JSON file.

  Args:
    path: the file (its folder is created when first written).
    identity: what the evaluation's remaining batches depend on besides
      what the ``Evaluator`` adds (its attacks' names, key and options):
      a resumed evaluation must have the same.
  """

  def __init__(self, path: str, identity: Mapping[str, Any]):
    self.named = os.fspath(path)
    self.identity = _canonical(identity)
    stem, ext = os.path.splitext(self.named)
    digest = hashlib.sha256(json.dumps(self.identity, sort_keys=True)
                            .encode()).hexdigest()[:12]
    # The file: the name given, keyed by the identity.
    self.path = f"{stem}.{digest}{ext}"

  def scoped(self, name: str) -> "Journal":
    """A journal of its own for part ``name`` of the evaluation (a seed of
    the strong protocol, ADMM's dense ``w``), beside this one."""
    stem, ext = os.path.splitext(self.named)
    return Journal(f"{stem}.{name}{ext}", {**self.identity, "part": name})

  def _read(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(state, identity)`` of the file (or of the one named without the
    digest, as fkjax named journals before), or None (none, or
    unreadable: the evaluation starts again, to the same result)."""
    for path in (self.path, self.named):
      try:
        with open(path) as f:
          state = json.load(f)
        identity = state.pop("metadata")["identity"]
      except (OSError, ValueError, KeyError, TypeError):
        continue
      if identity.get("caller") == self.identity:
        return state, identity
    return None

  def batches_done(self) -> int:
    """Batches an earlier attempt with this identity finished (0: none),
    whatever the attacks; for a log line before the evaluation starts."""
    read = self._read()
    if read is None or read[1].get("caller") != self.identity:
      return 0
    return int(read[0]["batches_done"])

  def load(self, own: Mapping[str, Any]) -> dict[str, Any] | None:
    """The state of an earlier attempt of this evaluation, or None.

    ``own``: the ``Evaluator``'s part of the identity. Returns the dict
    :meth:`save` wrote, its per-image vectors decoded to bool arrays.
    """
    read = self._read()
    if read is None or read[1] != {"caller": self.identity,
                                   "evaluator": _canonical(own)}:
      return None
    state = read[0]
    state["per_image"] = {
        name: workdir_lib.decode_correct(text, state["num_examples"])
        for name, text in state.get("per_image", {}).items()}
    partial = state.get("partial")
    if partial is not None:
      size = partial["batch_size"]
      partial["attacks"] = {
          name: (workdir_lib.decode_correct(text, size), spent)
          for name, (text, spent) in partial["attacks"].items()}
    return state

  def save(self, own: Mapping[str, Any], *, batches_done: int,
           num_examples: int, correct: Mapping[str, int],
           seconds: Mapping[str, float],
           compile_seconds: Mapping[str, float],
           predict_compile_seconds: float,
           per_image: Mapping[str, np.ndarray] | None,
           partial: Mapping[str, Any] | None = None) -> None:
    """Writes the state after ``batches_done`` batches, atomically.

    ``partial``: ``{"batch_index": the next batch, "attacks": {name:
    (bool right per image, seconds)}}``, the attacks already finished on
    the batch under way (a resumed attempt runs only the others).
    """
    state = {
        "batches_done": batches_done, "num_examples": num_examples,
        "correct": dict(correct), "seconds": dict(seconds),
        "compile_seconds": dict(compile_seconds),
        "predict_compile_seconds": predict_compile_seconds,
        "per_image": {name: workdir_lib.encode_correct(v)
                      for name, v in (per_image or {}).items()}}
    if partial:
      attacks = partial["attacks"]
      state["partial"] = {
          "batch_index": partial["batch_index"],
          "batch_size": len(next(iter(attacks.values()))[0]),
          "attacks": {name: [workdir_lib.encode_correct(right), spent]
                      for name, (right, spent) in attacks.items()}}
    workdir_lib.write_results(self.path, state, {
        "identity": {"caller": self.identity, "evaluator": _canonical(own)}})

  def remove(self) -> None:
    """Deletes the file (the evaluation's result is written), and one of
    the same identity named as before."""
    for path in (self.path, self.named):
      if path == self.named and self._read_named() is None:
        continue
      try:
        os.remove(path)
      except FileNotFoundError:
        pass

  def _read_named(self) -> dict[str, Any] | None:
    """The identity of the file named without the digest, where it is
    this journal's."""
    try:
      with open(self.named) as f:
        identity = json.load(f)["metadata"]["identity"]
    except (OSError, ValueError, KeyError, TypeError):
      return None
    return identity if identity.get("caller") == self.identity else None
