"""A paper-protocol result file keeps the attacks a new run did not redo.

``eval.py --config.eval.attacks=natural`` after ``natural,fgsm,ifgsm20``
used to replace ``eval_paper.json`` with the natural accuracy alone: the
FGSM and IFGSM^20 results were gone. :func:`merge` returns the document to
write instead: the new run's attacks, and the earlier file's other attacks
where that file was made under the same checkpoint (name and step), data
and settings (every config key but those that cannot change a number:
:data:`IGNORED`). Each attack's entry says what produced it (``produced``:
the date, the fkjax commit, the attacks evaluated together); the per-image
vectors and ADMM's dense ``w`` are kept per attack alike. Where the
earlier file was made otherwise (another checkpoint, batch size, ...), it
is kept whole in the new file's ``"earlier"`` list, and :func:`merge` says
so and why, for the caller to print: no evaluation is ever deleted.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

from fkjax.config import history
from fkjax.config import record as run_config

# Config keys (a section name covers the section) that say which attacks an
# evaluation ran, or where and how visibly, not what any attack measured.
IGNORED = ("eval.attacks", "eval.final_attacks", "eval.plots", "progress",
           "compilation_cache_dir", "dataset.data_dir",
           "dataset.tfds_data_dir", "dataset.download")
# The entry that keeps the earlier evaluations made under other settings.
EARLIER = "earlier"
# Entries beside "attacks" that hold one value per attack.
_PER_ATTACK = ("correct_per_image",)


def _ignored(key: str) -> bool:
  return any(key == k or key.startswith(k + ".") for k in IGNORED)


def mismatch(old_metadata: Mapping[str, Any],
             new_metadata: Mapping[str, Any]) -> str | None:
  """Why results of ``old_metadata`` are not comparable with those of
  ``new_metadata`` (None: the same checkpoint, data and settings)."""
  if not isinstance(old_metadata.get("config"), Mapping):
    return "the earlier file does not record its config"
  for key in ("checkpoint", "step", "data", "protocol"):
    if old_metadata.get(key) != new_metadata.get(key):
      return (f"{key} {old_metadata.get(key)!r}, now "
              f"{new_metadata.get(key)!r}")
  # Both completed alike: a key fkjax added since reads as its value
  # before (fkjax.config.history) on either side.
  diffs = [d for d in run_config.differences(
      old_metadata.get("config") or {},
      history.complete(new_metadata.get("config") or {}),
      ignore_environment=False) if not _ignored(d[0])]
  if diffs:
    key, then, now = diffs[0]
    more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
    return f"config.{key} {then!r}, now {now!r}{more}"
  return None


def produced(metadata: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
  """The ``produced`` note of an attack that a run of ``names`` measured."""
  return {"date": metadata.get("date"),
          "git_commit": metadata.get("git_commit"),
          "attacks_evaluated": ",".join(names)}


def _with_notes(document: dict[str, Any], note: dict[str, Any]) -> None:
  """Gives every attack of ``document`` (and of ADMM's dense ``w``) that
  has none the note ``note``."""
  for attacks in (document.get("attacks", {}),
                  document.get("admm_dense_w", {}).get("attacks", {})):
    for entry in attacks.values():
      if isinstance(entry, dict):   # else not fkjax's: left as it is
        entry.setdefault("produced", dict(note))


def merge(previous: Mapping[str, Any] | None, new: Mapping[str, Any],
          metadata: Mapping[str, Any], *, keep_attacks: bool = True
          ) -> tuple[dict[str, Any], str | None]:
  """``(document, remark)``: what to write for the new results ``new``
  (without metadata; written under ``metadata``) over the file's earlier
  content ``previous`` (with its ``"metadata"``; None: no file).

  The earlier file's attacks that ``new`` lacks are kept beside them where
  it was made under the same checkpoint and settings (``keep_attacks``).
  Where it was made otherwise, nothing of it is lost: the whole earlier
  document moves into the new one's ``"earlier"`` list (the latest first;
  the file's top level is always the latest evaluation). ``remark`` says
  what was kept, and where; None where there was nothing to say.
  """
  document = copy.deepcopy(dict(new))
  names = list(document.get("attacks", {}))
  _with_notes(document, produced(metadata, names))
  if not previous:
    return document, None
  old = copy.deepcopy(dict(previous))
  earlier = old.pop(EARLIER, None) or []
  if earlier:
    document[EARLIER] = earlier
  if not isinstance(old.get("attacks"), Mapping):
    old["attacks"] = {}
  old_metadata = old.get("metadata", {}) or {}
  _with_notes(old, produced(old_metadata, list(old["attacks"])))
  why = mismatch(old_metadata, metadata)
  if why is not None:
    document[EARLIER] = [old, *earlier]
    made = ", ".join(_made(n, e) for n, e in old["attacks"].items())
    return document, (
        f"the earlier results{' of ' + made if made else ''} were made "
        f"under another checkpoint or settings ({why}): kept in the file's "
        f"{EARLIER!r} list; its top level shows this evaluation's")
  extra = [name for name in old["attacks"] if name not in names]
  if not extra or not keep_attacks:
    return document, None
  made = ", ".join(_made(name, old["attacks"][name]) for name in extra)
  document["attacks"] = _ordered(old["attacks"], document["attacks"])
  for key in _PER_ATTACK:
    if key in old or key in document:
      document[key] = _ordered(old.get(key, {}), document.get(key, {}))
  if "admm_dense_w" in old and "admm_dense_w" in document:
    document["admm_dense_w"]["attacks"] = _ordered(
        old["admm_dense_w"]["attacks"], document["admm_dense_w"]["attacks"])
  return document, (f"kept the earlier results of {made}: same checkpoint "
                    "and settings")


def _made(name: str, entry: Any) -> str:
  """``fgsm (of DATE)``: an earlier attack, and when it was made."""
  produced = entry.get("produced") if isinstance(entry, dict) else None
  date = produced.get("date") if isinstance(produced, dict) else None
  return f"{name} (of {date})" if date else name


def _ordered(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
  """``old`` updated by ``new``: the earlier order, new names after it."""
  out = dict(old)
  out.update(new)
  return out
