"""Which finished runs home has, as a lent machine's checkout knows it.

A lease brings back the runs home has not received: their kept files
(:mod:`reproduce.archive`) differ from those home had or was sent. The
ledger, ``<root>/lease_ledger.json`` beside the workdirs (ignored by git,
so kept on the machine while it stays warm and gone on a fresh one), maps
each such run's name to a digest of its kept files. The first call on a
machine writes it from the checkout's ``results/``, which is home's then;
each pack adds what it sent, once its parts are written. A call killed
before its pack adds nothing, so the next call on that machine brings back
what the killed one finished (a mark of the call's start could not: those
runs are older than it).
"""
from __future__ import annotations

import hashlib
import os
from typing import Mapping, Sequence

from fkjax import atomic
from reproduce import archive
from reproduce import files
from reproduce import queue as queue_lib

LEDGER = "lease_ledger.json"


def path(root: str) -> str:
  return os.path.join(root, LEDGER)


def run_files(folder: str) -> list[str]:
  """The files of a kept run, in name order; not a write a kill cut short
  (:func:`fkjax.atomic.replacing`'s ``.tmp``)."""
  return [os.path.join(folder, n) for n in sorted(os.listdir(folder))
          if os.path.isfile(os.path.join(folder, n)) and ".tmp" not in n]


def digest(folder: str) -> str:
  """SHA-256 over the names and bytes of :func:`run_files`."""
  h = hashlib.sha256()
  for full in run_files(folder):
    h.update(os.path.basename(full).encode() + b"\0")
    with open(full, "rb") as f:
      h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()


def kept_runs(entries: Sequence[queue_lib.Entry], results: str
              ) -> dict[str, str]:
  """Name -> digest of every run of ``entries`` kept under ``results``
  (a record there: finished, or failed and reported)."""
  out = {}
  for entry in entries:
    kept = entry.archive(results)
    if os.path.exists(os.path.join(kept, archive.RUN_RECORD)):
      out[entry.name] = digest(kept)
  return out


def load(root: str) -> dict[str, str]:
  """What home has or was sent ({} where no call wrote it yet)."""
  return files.load_json(path(root)) or {}


def start(root: str, entries: Sequence[queue_lib.Entry], results: str
          ) -> bool:
  """Writes home's runs, as the checkout brings them, where no call on this
  machine has (a fresh machine); returns whether it did."""
  if os.path.exists(path(root)):
    return False
  os.makedirs(root, exist_ok=True)
  atomic.write_json(path(root), kept_runs(entries, results))
  return True


def add(root: str, sent: Mapping[str, str]) -> None:
  """Notes the runs a pack sent home."""
  atomic.write_json(path(root), {**load(root), **sent})
