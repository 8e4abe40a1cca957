"""What a lent GPU does with the queue, and what home does with its output.

On the lent machine (``benchmarks/gpu_reproduce.sh`` with no arguments)::

  python -m reproduce.lease prepare --jobs=2   # one line per job
  ... the jobs run until the deadline ...
  python -m reproduce.lease pack --out=$OUT

``prepare`` unpacks the committed state of the next units' carried runs
into their workdirs and prints the jobs: the next units dealt round-robin,
so that with the queue's interleaved order one job trains the paper scale's
run and the other the gpu scale's rows. ``pack`` gathers, under the device
tool's limits on what comes back (files of 16 MiB at most, 8 files, 64 MiB
in all), the kept files (and published weights) of every finished run home
has not received (:mod:`reproduce.ledger`: those finished in this call, or
in an earlier call on this machine killed before its pack) and the carried
state of every run stopped mid-way, as one tar cut into parts
(``lease.tar.part-NN``) with a manifest (``lease.json``).

At home, in the repository root::

  python -m reproduce unpack <the folder the files came back to>

checks the parts against the manifest, puts the runs under ``results/``,
removes the carried state of runs that finished, rewrites the tables they
belong to and ``results/queue.md``; commit ``results/``.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from typing import Any, Mapping, Sequence

from fkjax import atomic
from reproduce import archive
from reproduce import carry
from reproduce import files
from reproduce import ledger
from reproduce import queue as queue_lib
from reproduce import tables as tables_lib

MANIFEST = "lease.json"
TAR = "lease.tar"
MIB = 1 << 20
# The device tool brings back 8 files of 16 MiB, 64 MiB together: parts of
# 15 MiB, 4 of them at most, and the manifest.
PART_BYTES = 15 * MIB
MAX_BYTES = 60 * MIB
DEFAULT_QUEUE = os.path.join("results", queue_lib.QUEUE_FILE)


def prepare(entries: Sequence[queue_lib.Entry], results: str, root: str,
            jobs: int, units_per_job: int = 3) -> list[list[queue_lib.Unit]]:
  """The next units, dealt round-robin to ``jobs`` jobs; the carried state
  of their runs unpacked into their workdirs. On a fresh machine, first
  notes the runs home has (:func:`reproduce.ledger.start`)."""
  ledger.start(root, entries, results)
  units = queue_lib.next_units(entries, results, jobs * units_per_job)
  for unit in units:
    for seed in unit.seeds:
      entry = queue_lib.Entry(unit.scale, unit.table, unit.row, seed)
      if carry.unpack(entry.carry(results), entry.workdir(root)):
        print(f"# resumed from {entry.carry(results)}", file=sys.stderr)
  return [units[i::jobs] for i in range(jobs) if units[i::jobs]]


def _same_bytes(a: str, b: str) -> bool:
  if not (os.path.exists(a) and os.path.exists(b)):
    return False
  with open(a, "rb") as fa, open(b, "rb") as fb:
    return fa.read() == fb.read()


def _sweep_resume_steps(entries: Sequence[queue_lib.Entry], results: str,
                        root: str) -> dict[queue_lib.Entry, int]:
  """The step each run of a unit's next sweep resumes from: the earliest of
  its runs' latest checkpoints (a sweep resumes them together; those a save
  ahead must carry that step too). Runs with a finished record are not in
  that sweep (nor, on a fresh machine, in a workdir)."""
  out = {}
  for unit in queue_lib.units(entries):
    runs = [r for r in (queue_lib.Entry(unit.scale, unit.table, unit.row, s)
                        for s in unit.seeds)
            if not (files.load_json(os.path.join(
                r.archive(results), archive.RUN_RECORD)) or {}).get("done")]
    if len(runs) < 2:
      continue
    step = min(max(carry.checkpoint_steps(r.workdir(root)), default=0)
               for r in runs)
    out.update({r: step for r in runs})
  return out


def gather(entries: Sequence[queue_lib.Entry], results: str, root: str,
           sent: Mapping[str, str], max_bytes: int = MAX_BYTES
           ) -> dict[str, Any]:
  """What a lease brings back: the manifest (``files``: paths under
  ``results``' parent, in the order to pack them; ``digests``: those of the
  runs it brings, for the ledger). ``sent``: name -> digest of the kept
  runs home has (:func:`reproduce.ledger.load`)."""
  finished, carried, dropped, removed = [], [], [], []
  digests: dict[str, str] = {}
  paths: list[str] = []
  size = 0
  candidates = []
  for entry in entries:
    kept = entry.archive(results)
    record = os.path.join(kept, archive.RUN_RECORD)
    if os.path.exists(record) and (
        digest := ledger.digest(kept)) != sent.get(entry.name):
      # finished, or given an extra evaluation, and not yet home
      run_files = ledger.run_files(kept)
      run_bytes = sum(os.path.getsize(p) for p in run_files)
      if size + run_bytes > max_bytes:
        dropped.append(entry.name)   # the next call brings it
        continue
      finished.append(entry.name)
      digests[entry.name] = digest
      paths += run_files
      size += run_bytes
    if not (os.path.exists(entry.carry(results))
            or carry.checkpoint_steps(entry.workdir(root))):
      continue   # no state of it here nor home (and no plan to read)
    if (files.load_json(record) or {}).get("done") and not (
        queue_lib.pending_evals(entry, results)):
      # complete: nothing of it is carried any more
      if os.path.exists(entry.carry(results)):
        removed.append(entry.carry(results))
      continue
    # stopped mid-way (training, or an evaluation after its record)
    if carry.checkpoint_steps(entry.workdir(root)):
      candidates.append(entry)
  resume_steps = _sweep_resume_steps(entries, results, root)
  for entry in candidates:
    path = entry.carry(results)
    fresh = f"{path}.new"
    carry.pack(entry.workdir(root), fresh,
               also=[resume_steps[entry]] if entry in resume_steps else [])
    if _same_bytes(fresh, path):   # not advanced in this lease
      os.remove(fresh)
      continue
    if size + os.path.getsize(fresh) > max_bytes:
      dropped.append(entry.name)
      os.remove(fresh)
      continue
    os.replace(fresh, path)
    size += os.path.getsize(path)
    carried.append(entry.name)
    paths.append(path)
  return {"finished": finished, "carried": carried, "dropped": dropped,
          "removed": removed, "files": paths, "bytes": size,
          "digests": digests}


def write_parts(manifest: dict[str, Any], out: str, base: str,
                logs: str | None = None, part_bytes: int = PART_BYTES
                ) -> list[str]:
  """Writes the tar of ``manifest["files"]`` (paths relative to ``base``)
  and ``logs`` in parts to ``out``, then the manifest; returns the parts."""
  os.makedirs(out, exist_ok=True)
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w") as tar:
    for path in manifest["files"]:
      tar.add(path, arcname=os.path.relpath(path, base))
    if logs and os.path.isdir(logs):
      tar.add(logs, arcname="logs")
  blob = buffer.getvalue()
  parts = []
  for i in range(0, max(len(blob), 1), part_bytes):
    name = f"{TAR}.part-{i // part_bytes:02d}"
    atomic.write_bytes(os.path.join(out, name), blob[i:i + part_bytes])
    parts.append(name)
  manifest = {**manifest,
              "files": [os.path.relpath(p, base) for p in manifest["files"]],
              "removed": [os.path.relpath(p, base)
                          for p in manifest["removed"]],
              "parts": parts, "tar_bytes": len(blob),
              "sha256": hashlib.sha256(blob).hexdigest()}
  atomic.write_json(os.path.join(out, MANIFEST), manifest)
  return parts


def unpack(folder: str, base: str = ".") -> dict[str, Any]:
  """Puts what a lease brought back (``folder``) into ``base``'s
  ``results/``; returns its manifest. Raises ValueError on a part that is
  missing or damaged."""
  manifest = files.load_json(os.path.join(folder, MANIFEST))
  if manifest is None:
    raise ValueError(f"{folder} has no {MANIFEST}: not a lease's output")
  blob = b""
  for name in manifest["parts"]:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
      raise ValueError(f"{path} is missing: bring back every part")
    with open(path, "rb") as f:
      blob += f.read()
  if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
    raise ValueError(f"the parts in {folder} do not join into the tar the "
                     "lease wrote (sha256 differs): a part is damaged")
  with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
    members = [m for m in tar.getmembers()
               if m.name.split("/")[0] == "results"]
    tar.extractall(base, members=members, filter="data")
    logs = [m for m in tar.getmembers() if m.name.startswith("logs/")]
    tar.extractall(folder, members=logs, filter="data")
  for rel in manifest["removed"]:
    path = os.path.join(base, rel)
    if os.path.exists(path):
      os.remove(path)
  return manifest


def touched_tables(names: Sequence[str]) -> dict[str, list[str]]:
  """Scale -> the tables that report the runs ``names``
  (``<scale>/<table>/<row>/seed<k>``; shared rows included)."""
  owners: dict[str, set[tuple[str, str]]] = {}
  for name in names:
    scale, table, row, _ = name.split("/")
    owners.setdefault(scale, set()).add((table, row))
  out = {}
  for scale, owned in owners.items():
    hit = []
    for table in tables_lib.TABLES.values():
      for row in table.rows:
        owner_table, owner = ((tables_lib.resolve_shared(row)) if row.shared
                              else (table, row))
        if (owner_table.name, owner.name) in owned:
          hit.append(table.name)
          break
    out[scale] = hit
  return out


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m reproduce.lease",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("action", choices=("prepare", "pack"))
  p.add_argument("--queue", default=DEFAULT_QUEUE)
  p.add_argument("--results", default="results")
  p.add_argument("--root", default="workdirs/reproduce")
  p.add_argument("--jobs", type=int, default=2)
  p.add_argument("--out", default=None, help="pack: where the files go")
  p.add_argument("--logs", default=None, help="pack: a folder of logs")
  p.add_argument("--part-bytes", type=int, default=PART_BYTES)
  p.add_argument("--max-bytes", type=int, default=MAX_BYTES)
  args = p.parse_args(argv)
  try:
    entries = queue_lib.load(args.queue)
  except queue_lib.QueueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.action == "prepare":
    for job in prepare(entries, args.results, args.root, args.jobs):
      print(";".join(" ".join(u.runner_args()) for u in job))
    return 0
  if not args.out:
    print("error: pack needs --out", file=sys.stderr)
    return 2
  manifest = gather(entries, args.results, args.root,
                    ledger.load(args.root), args.max_bytes)
  parts = write_parts(manifest, args.out, os.path.dirname(
      os.path.abspath(args.results)), args.logs, args.part_bytes)
  # only now: a call killed before here leaves them to the next one
  ledger.add(args.root, manifest["digests"])
  print(json.dumps({k: manifest[k] for k in
                    ("finished", "carried", "dropped", "bytes")}))
  print(f"{len(parts)} part(s) and {MANIFEST} in {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
