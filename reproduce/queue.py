"""The committed queue of runs that every lent GPU advances (``results/queue.json``).

The queue is a list of runs in order, each ``{"scale", "table", "row",
"seed"}``, naming the table and row that train it (a shared row's owner).
Where each run stands is read from ``results/``, never stored in the queue:

* ``done``: its record is kept under ``results/<scale>/runs/`` (finished,
  :mod:`reproduce.archive`);
* ``carried``: its last checkpoint is committed under
  ``results/<scale>/carry/`` (:mod:`reproduce.carry`): the next lease
  resumes it;
* ``pending``: not started.

Consecutive runs of one row form a *unit*: ``python -m reproduce
<table> --scale=<scale> --rows=<row> --seeds=<n> --sweep`` trains its seeds
as one program and skips those finished.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable, Sequence

from fkjax import atomic
from reproduce import archive
from reproduce import carry
from reproduce import files
from reproduce import scales as scales_lib
from reproduce import tables as tables_lib
from reproduce import weights

QUEUE_FILE = "queue.json"
# What the published weights may take in the repository, in all.
WEIGHTS_BUDGET_MB = 150
DONE, CARRIED, PENDING = "done", "carried", "pending"


class QueueError(ValueError):
  """A queue file that names no run fkjax knows (one line)."""


@dataclasses.dataclass(frozen=True)
class Entry:
  """One run of the queue."""
  scale: str
  table: str
  row: str
  seed: int

  @property
  def name(self) -> str:
    """``<scale>/<table>/<row>/seed<k>``, as :func:`fkjax.pretrained.load`
    takes it."""
    return f"{self.scale}/{self.table}/{self.row}/seed{self.seed}"

  def archive(self, results: str) -> str:
    return archive.archive_dir(results, self.scale, self.table, self.row,
                               self.seed)

  def carry(self, results: str) -> str:
    return carry.carry_path(results, self.scale, self.table, self.row,
                            self.seed)

  def workdir(self, root: str) -> str:
    return os.path.join(root, self.scale, self.table,
                        f"{self.row}_seed{self.seed}")


@dataclasses.dataclass(frozen=True)
class Unit:
  """Consecutive runs of one row: one runner command."""
  scale: str
  table: str
  row: str
  seeds: tuple[int, ...]

  def runner_args(self) -> list[str]:
    """The ``python -m reproduce`` arguments that run it (its seeds
    from 0; finished ones are skipped)."""
    return [self.table, *scales_lib.command_flags(self.scale).split(),
            f"--rows={self.row}", f"--seeds={max(self.seeds) + 1}",
            "--sweep"]


def _check(entry: Entry) -> None:
  base = entry.scale.partition("-")[0]
  if base not in scales_lib.SCALES:
    raise QueueError(f"queue entry {entry.name}: no scale {base!r}; one of "
                     f"{sorted(scales_lib.SCALES)}")
  if entry.table not in tables_lib.TABLES:
    raise QueueError(f"queue entry {entry.name}: no table {entry.table!r}")
  try:
    row = tables_lib.TABLES[entry.table].row(entry.row)
  except KeyError as e:
    raise QueueError(f"queue entry {entry.name}: {e.args[0]}") from e
  if row.shared:
    owner_table, owner = tables_lib.resolve_shared(row)
    raise QueueError(f"queue entry {entry.name}: the row is trained by "
                     f"{owner_table.name}/{owner.name}; queue that instead")
  if entry.seed < 0:
    raise QueueError(f"queue entry {entry.name}: negative seed")


def parse(data: dict) -> list[Entry]:
  """The entries of a queue file's data, checked."""
  try:
    entries = [Entry(str(e["scale"]), str(e["table"]), str(e["row"]),
                     int(e["seed"])) for e in data["runs"]]
  except (KeyError, TypeError, ValueError) as e:
    raise QueueError(f"a queue is {{\"runs\": [{{\"scale\", \"table\", "
                     f"\"row\", \"seed\"}}, ...]}} ({type(e).__name__}: "
                     f"{e})") from e
  seen = set()
  for entry in entries:
    _check(entry)
    if entry in seen:
      raise QueueError(f"queue entry {entry.name} is listed twice")
    seen.add(entry)
  return entries


def load(path: str) -> list[Entry]:
  data = files.load_json(path)
  if data is None:
    raise QueueError(f"{path} is missing or not JSON")
  return parse(data)


def write(path: str, entries: Sequence[Entry], note: str = "") -> None:
  data = {"note": note} if note else {}
  data["runs"] = [dataclasses.asdict(e) for e in entries]
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  atomic.write_text(path, json.dumps(data, indent=1) + "\n")


def scale_of(name: str) -> scales_lib.Scale:
  """The scale a result folder is named after (``cpu-long``: a variant)."""
  base, _, variant = name.partition("-")
  scale = scales_lib.SCALES[base]
  return scales_lib.with_variant(scale, variant) if variant else scale


def pending_evals(entry: Entry, results: str) -> list[str]:
  """The extra evaluations (A5, the strong protocol) the kept run lacks:
  its record is written before them, so a lease can end between."""
  from reproduce import runner  # pylint: disable=import-outside-toplevel
  run = runner.plan(tables_lib.TABLES[entry.table], scale_of(entry.scale),
                    root="", rows=[entry.row], seeds=entry.seed + 1)[-1]
  view = dataclasses.replace(run, workdir=entry.archive(results))
  return [f"eval_{e.protocol}" for e in runner.pending_evals(view)]


def state(entry: Entry, results: str) -> str:
  """``done``, ``carried`` or ``pending`` (see the module docstring). A
  kept run whose extra evaluations are pending is ``carried`` while its
  checkpoint is: the next lease evaluates it."""
  record = files.load_json(os.path.join(entry.archive(results),
                                        archive.RUN_RECORD))
  carried = os.path.exists(entry.carry(results))
  if record and record.get("done") and not (
      carried and pending_evals(entry, results)):
    return DONE
  return CARRIED if carried else PENDING


def units(entries: Iterable[Entry]) -> list[Unit]:
  """Consecutive entries of one row merged into units, in order."""
  out: list[Unit] = []
  for e in entries:
    last = out[-1] if out else None
    if last and (last.scale, last.table, last.row) == (e.scale, e.table,
                                                       e.row):
      out[-1] = dataclasses.replace(last, seeds=(*last.seeds, e.seed))
    else:
      out.append(Unit(e.scale, e.table, e.row, (e.seed,)))
  return out


def next_units(entries: Sequence[Entry], results: str, count: int
               ) -> list[Unit]:
  """The first ``count`` units with a run not done."""
  todo = [e for e in entries if state(e, results) != DONE]
  return units(todo)[:count]


def summary(entries: Sequence[Entry], results: str) -> str:
  """The queue's state in Markdown: counts, then every run."""
  states = [(e, state(e, results)) for e in entries]
  counts = {s: sum(1 for _, t in states if t == s)
            for s in (DONE, CARRIED, PENDING)}
  published = [os.path.getsize(p) for e in entries
               if os.path.exists(p := os.path.join(
                   e.archive(results), weights.WEIGHTS_FILE))]
  lines = ["# The reproduction queue", "",
           f"{len(entries)} runs: {counts[DONE]} done, {counts[CARRIED]} "
           f"carried (a checkpoint committed, resumed by the next lease), "
           f"{counts[PENDING]} pending. Written by `python -m "
           "reproduce queue`; the order is `results/queue.json`'s "
           "(docs/reproduction.md, \"The queue\").", "",
           f"Published weights: {len(published)} run(s), "
           f"{sum(published) / 1e6:.1f} MB of the {WEIGHTS_BUDGET_MB} MB "
           "budget.", "",
           "| # | run | state |", "| --- | --- | --- |"]
  lines += [f"| {i} | {e.name} | {s} |" for i, (e, s) in
            enumerate(states, 1)]
  return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# The committed queue's order (issue 53).

# The paper scale's headline (the abstract: RGSM ResNet20 lambda1 = 0.1
# against En5ResNet20 lambda1 = 0.02), then the unpruned nets.
PAPER_HEADLINE = (("table2", "resnet20_rgsm_l0.1"),
                  ("table2", "en5resnet20_rgsm_l0.02"),
                  ("table1", "resnet20_none"),
                  ("table1", "en2resnet20_none"))
# The gpu scale's tables in the order the issue gives.
GPU_TABLES = ("table2", "table1", "table3", "fig45", "table4", "table5",
              "table6")


def default_entries() -> list[Entry]:
  """The paper scale's headline runs interleaved with the gpu scale's
  rows: each lease's two jobs (``gpu_reproduce.sh``) take one of each."""
  gpu = scales_lib.SCALES["gpu"]
  paper = [Entry("paper", t, r, 0) for t, r in PAPER_HEADLINE]
  gpu_units: list[list[Entry]] = []
  queued = set()
  for name in GPU_TABLES:
    table = tables_lib.TABLES[name]
    # A table's rows in its order; a shared row as its owner, where no
    # table before queued it (Table 2's unpruned ResNet20 is Table 1's).
    for row in table.rows:
      seeds = row.seeds.get("gpu", table.seeds.get("gpu", gpu.seeds))
      owner_table, owner = ((tables_lib.resolve_shared(row)) if row.shared
                            else (table, row))
      if (owner_table.name, owner.name) in queued:
        continue
      queued.add((owner_table.name, owner.name))
      gpu_units.append([Entry("gpu", owner_table.name, owner.name, s)
                        for s in range(seeds)])
  out: list[Entry] = []
  for i in range(max(len(paper), len(gpu_units))):
    if i < len(paper):
      out.append(paper[i])
    if i < len(gpu_units):
      out += gpu_units[i]
  return out
