"""Where a run's time goes, and what the runner says as it runs.

``<workdir>/reproduce_progress.json`` keeps the seconds and state of each
stage, written every :data:`HEARTBEAT_SECONDS` while one runs, so that a
kill -9 keeps all but the last few seconds.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from fkjax import atomic
from reproduce import files
from reproduce.run import archive as archive_lib

HEARTBEAT_SECONDS = 10.0


def log(message: str) -> None:
  """A progress line, flushed (the runner's output is usually a log file)."""
  stamp = time.strftime("%H:%M:%S")
  print(f"[reproduce {stamp}] {message}", flush=True)


class Progress:
  """``<workdir>/reproduce_progress.json``: seconds and state of each stage.

  While a stage runs, a thread writes its elapsed time every
  :data:`HEARTBEAT_SECONDS`, so a killed stage's time is kept (all but the
  last few seconds) and the resumed attempt adds to it.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, archive_lib.PROGRESS_FILE)
    self.data: dict[str, Any] = {"stages": {}}
    # A damaged file stops the run in one line: read as empty, it would
    # lose the stages' times and fingerprints.
    self.data = files.load_json(self.path, files.PROGRESS) or self.data
    self._lock = threading.Lock()

  def stage(self, name: str) -> dict[str, Any]:
    return self.data["stages"].setdefault(
        name, {"seconds": 0.0, "attempts": 0, "done": False})

  def done(self, name: str, fingerprint: str) -> bool:
    s = self.data["stages"].get(name)
    return bool(s and s["done"] and s.get("fingerprint") == fingerprint)

  def kept(self) -> dict[str, str]:
    """Stage -> the fingerprint it was done with, for the stages done."""
    return {k: s.get("fingerprint", "")
            for k, s in self.data["stages"].items() if s.get("done")}

  def save(self) -> None:
    with self._lock:
      atomic.write_json(self.path, self.data)

  def timed(self, name: str, fingerprint: str, fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` as stage ``name``, accounting its wall time."""
    return timed_together([self], name, [fingerprint], fn)


def timed_together(progresses: list[Progress], name: str,
                   fingerprints_: list[str], fn: Callable[[], Any]) -> Any:
  """Runs ``fn`` as stage ``name`` of one or several runs (a sweep): each
  run is charged its share of the wall time, saved every heartbeat so that
  a kill keeps what was spent."""
  stages = [p.stage(name) for p in progresses]
  for s, fp in zip(stages, fingerprints_):
    s["attempts"] += 1
    s["done"] = False
    s["fingerprint"] = fp
    if len(progresses) > 1:
      s["sweep_runs"] = len(progresses)
  bases = [s["seconds"] for s in stages]
  start = time.monotonic()
  stop = threading.Event()

  def update():
    share = (time.monotonic() - start) / len(progresses)
    for p, s, base in zip(progresses, stages, bases):
      s["seconds"] = base + share
      p.save()

  def beat():
    while not stop.wait(HEARTBEAT_SECONDS):
      update()
  thread = threading.Thread(target=beat, daemon=True)
  update()
  thread.start()
  try:
    result = fn()
  finally:
    stop.set()
    thread.join()
    update()
  for p, s in zip(progresses, stages):
    s["done"] = True
    p.save()
  return result
