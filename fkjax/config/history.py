"""Settings added to fkjax, or whose default changed, after runs were saved.

A run's ``config.json`` (and each evaluation's result file) records every
key fkjax had when it ran. A key added later is absent from those records,
and a changed default makes a new run differ from an old one. Neither may
make a finished run count as another run: :data:`CHANGES` says, for each
such key, the value that reproduces how the runs saved before it ran.

* A key absent from a record is read as its ``before`` value
  (:func:`complete`): adding ``precision`` (all runs before it trained in
  float32) changes nothing for them, nor its default becoming ``"auto"``
  (float32 on the CPUs they ran on).
* A recorded ``before`` value where the config now asks another is a run
  (or an evaluation) made under older settings (:func:`older`): kept and
  reported as such, never thrown away; ``reproduce`` marks the columns it
  fills (where its table asks for today's default, not a value of its
  own). A difference in a key not listed here is a different run.

A key that changes only how fast a stage runs, never its results, is in
:data:`SPEED_ONLY` instead: a run recorded with another value is current.

Contributors: when you add a config key whose default is not None, or
change a default, add a line here (docs/reproduction.md, "Adding or changing
a setting"). A test checks that the runs committed under ``results/`` stay
finished.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Iterable, Mapping

from fkjax.config import keys as config_keys


@dataclasses.dataclass(frozen=True)
class Change:
  """A key added, or a default changed, on ``date``.

  Attributes:
    key: the dotted config key.
    date: when (``YYYY-MM-DD``).
    before: the value that reproduces the runs saved before that date.
    what: what changed, in a few words (said in the tables' notes).
  """
  key: str
  date: str
  before: Any
  what: str

  def describe(self, now: Any) -> str:
    """``eval.strong.targeted=False, the default before 2026-12-03 (APGD-T
    ...) (now True)``."""
    return (f"{self.key}={self.before!r}, the default before {self.date} "
            f"({self.what}; now {now!r})")


CHANGES: tuple[Change, ...] = (
    # Added on 2026-12-03 with the default "float32"; "auto" since (tf32
    # on GPUs and TPUs, float32 on CPUs: a CPU run still records float32).
    Change("precision", "2026-12-07", "float32",
           "config.precision's default became 'auto', TF32 convolutions "
           "on GPUs and TPUs; every run before trained in float32"),
    Change("eval.strong.targeted", "2026-12-03", False,
           "APGD-T joined the strong protocol, as in AutoAttack's standard "
           "version"),
)

# Keys that change how fast a stage runs, never what it computes (its
# results are the same whatever their value, tests say so): a difference in
# them is no difference, whatever the value a run recorded.
SPEED_ONLY = frozenset({
    # NAttack's population chunk: the same images whatever the chunk
    # (tests/test_gpu_lowering.py); 10 before 2026-12-06, now 0 (as many as
    # the device's memory holds).
    "eval.nattack_chunk",
})


def change_of(key: str) -> Change | None:
  """The entry of ``key``, or None if it was never added nor changed."""
  return next((c for c in CHANGES if c.key == key), None)


def complete(recorded: Mapping[str, Any],
             changes: Iterable[Change] | None = None) -> dict[str, Any]:
  """``recorded`` (a saved config as plain data) with each listed key it
  lacks set to the value that reproduces how it ran (a copy)."""
  out = copy.deepcopy(dict(recorded))
  for change in CHANGES if changes is None else changes:
    if not config_keys.has(out, change.key):
      node = out
      *parents, leaf = change.key.split(".")
      for part in parents:
        node = node.setdefault(part, {})
      node[leaf] = change.before
  return out


def older(key: str, recorded: Any, now: Any) -> Change | None:
  """The change that explains ``recorded`` differing from ``now`` at
  ``key`` (a run made before it), or None (a different run)."""
  change = change_of(key)
  if change is None or recorded != change.before or now == change.before:
    return None
  return change
