"""An unfinished run's state, committed so that a later lease resumes it.

A run stopped at a lease's deadline is packed into one compressed file,
``results/<scale>/carry/<table>/<row>_seed<k>.tar.xz``: its workdir's small
files (config, metrics log, progress, an evaluation's finished batches) and
its *last* checkpoint, plus the best one where that is another step (the
evaluation reads the best: without it a resumed run could evaluate another
checkpoint than a run never stopped), plus, for a run of a sweep, the step
the sweep resumes from (:func:`fkjax.training.sweep.loop.resume_step`: a sweep
saves its runs one after another, so a stop in between leaves some a save
ahead of the others). Older checkpoints, locks and temporary files stay
behind. The next lease, on any machine, unpacks it into the run's workdir
and the runner resumes from that checkpoint; once the run finishes its
carry file is removed (its results and weights are kept under
``results/<scale>/runs/`` instead).
"""
from __future__ import annotations

import io
import os
import tarfile
from typing import Iterable

from fkjax import atomic

CARRY_DIR = "carry"
SUFFIX = ".tar.xz"
# Never carried: another process's lock, orbax's unfinished writes, logs
# that are rebuilt.
_SKIP = ("fkjax.lock", ".orbax-checkpoint-tmp", ".tmp", "tensorboard")
# xz's preset. Orbax already compresses a checkpoint's arrays: xz gains 1-3%
# at any preset, and 0 packs in a third of 6's time
# (benchmarks/bench_carry.py, docs/reproduction.md).
PRESET = 0


def carry_path(results: str, scale: str, table: str, row: str, seed: int
               ) -> str:
  return os.path.join(results, scale, CARRY_DIR, table,
                      f"{row}_seed{seed}{SUFFIX}")


def checkpoint_steps(workdir: str) -> list[int]:
  """The finished checkpoint steps in ``workdir`` (orbax's step folders)."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def kept_steps(workdir: str) -> list[int]:
  """The latest checkpoint step and the best one (one step if the same)."""
  steps = checkpoint_steps(workdir)
  if not steps:
    return []
  # Orbax reads its own metadata: the best step is the one it keeps for
  # the highest validation accuracy. Imported here (JAX).
  from fkjax import checkpoint  # pylint: disable=import-outside-toplevel
  checkpointer = checkpoint.Checkpointer(workdir, must_exist=True)
  try:
    best = checkpointer.best_step()
  finally:
    checkpointer.close()
  return sorted({steps[-1], *([best] if best is not None else [])})


def _wanted(rel: str, steps: list[int]) -> bool:
  if any(s in rel for s in _SKIP):
    return False
  parts = rel.split(os.sep)
  if parts[0] == "checkpoints" and len(parts) > 1:
    return parts[1].isdigit() and int(parts[1]) in steps
  return True


def pack(workdir: str, path: str, also: Iterable[int] = (),
         preset: int = PRESET) -> int:
  """Writes ``workdir``'s carried state to ``path``; returns its size.
  ``also``: further steps to carry, where the workdir has them; ``preset``:
  xz's (0-9)."""
  steps = sorted({*kept_steps(workdir),
                  *(set(also) & set(checkpoint_steps(workdir)))})
  names = []
  for dirpath, dirnames, filenames in os.walk(workdir):
    dirnames.sort()
    for name in sorted(filenames):
      full = os.path.join(dirpath, name)
      rel = os.path.relpath(full, workdir)
      if _wanted(rel, steps):
        names.append(rel)
  with atomic.replacing(path, "wb") as f, tarfile.open(
      fileobj=f, mode="w:xz", preset=preset) as tar:
    for rel in names:
      info = tar.gettarinfo(os.path.join(workdir, rel), arcname=rel)
      # Byte-identical archives for identical states: no owner, no time.
      info.uid = info.gid = 0
      info.uname = info.gname = ""
      info.mtime = 0
      with open(os.path.join(workdir, rel), "rb") as f:
        tar.addfile(info, io.BytesIO(f.read()))
  return os.path.getsize(path)


def unpack(path: str, workdir: str) -> bool:
  """Gives a workdir without checkpoints the state carried in ``path``;
  returns whether it did (a workdir with checkpoints is further along, or
  the same run: left alone)."""
  if checkpoint_steps(workdir) or not os.path.exists(path):
    return False
  os.makedirs(workdir, exist_ok=True)
  with tarfile.open(path, "r:xz") as tar:
    tar.extractall(workdir, filter="data")
  return True
