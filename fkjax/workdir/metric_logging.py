"""Per-epoch metrics, TensorBoard event files, and progress output.

``MetricLogger.write`` appends one JSON line to ``<workdir>/metrics.jsonl``
and the scalars to ``<workdir>/tensorboard``, and both are on disk (flushed
and ``fsync``'d) when it returns; ``plot_curves`` redraws
``<workdir>/plots/training_curves.png`` from them (:mod:`fkjax.workdir.curves`;
``plot_curves_later`` on a worker thread),
and ``write_test`` adds a test evaluation's accuracies to TensorBoard. Call it before saving the epoch's
checkpoint: a process killed in between then loses nothing, and the resumed
run logs that epoch again. ``read_metrics`` returns one record per epoch (the
last one logged), and TensorBoard hides the superseded scalars (the writer
marks the resumed step as a restart point, tensorboard's ``purge_step``).

TensorBoard files are written with tensorboardX's protobufs and record
writer, but synchronously: its ``SummaryWriter`` queues events for a
background thread that writes them up to ``flush_secs`` (2 minutes) later,
so a ``kill -9`` lost the last epoch's scalars. (CLU's metric writers need
TensorFlow, which fkjax does not otherwise require.)
``tensorboard --logdir <workdir>/tensorboard``.

``progress(iterable, ...)`` shows a tqdm bar on a terminal and plain lines
(``epoch 3/200: 120/391 steps ...``) every ``interval`` seconds otherwise,
so that logs of ``nohup``/SLURM runs stay readable and greppable.
"""
from __future__ import annotations

import glob
from concurrent import futures
import itertools
import json
import os
import sys
import time
from typing import Any, Iterable, Iterator, Mapping, TextIO

import tqdm


class MetricLogger:
  """Appends metrics to JSON lines and TensorBoard; prints text lines.

  Args:
    workdir: the run's directory.
    enabled: False on all but one process of a multi-process run.
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._path = os.path.join(workdir, "metrics.jsonl")
    self._tb_dir = os.path.join(workdir, "tensorboard")
    self._tb = None  # opened at the first write: its step marks a restart
    self._checked_tail = False
    # plot_curves_later's worker and its last redraw
    self._plotter: futures.ThreadPoolExecutor | None = None
    self._plot: futures.Future | None = None

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Appends a record; on disk when this returns."""
    if not self.enabled:
      return
    record = {"step": step, "time": time.time(), **metrics}
    os.makedirs(os.path.dirname(self._path) or ".", exist_ok=True)
    line = json.dumps(record) + "\n"
    if not self._checked_tail:
      # A line cut short by a crash must not swallow this one.
      self._checked_tail = True
      if not _ends_with_newline(self._path):
        line = "\n" + line
    with open(self._path, "a") as f:
      f.write(line)
      f.flush()
      os.fsync(f.fileno())
    if self._tb is None:
      self._tb = _EventFile(self._tb_dir, first_step=step)
    self._tb.write_scalars(
        step, {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)})

  def log_text(self, text: str) -> None:
    if self.enabled:
      print(text, file=sys.stdout, flush=True)

  def plot_curves(self) -> str | None:
    """Redraws ``plots/training_curves.png`` from the records written so
    far (:mod:`fkjax.workdir.curves`); its path, None where disabled."""
    if not self.enabled:
      return None
    from fkjax.workdir import curves  # matplotlib only when drawn
    workdir = os.path.dirname(self._path) or "."
    return curves.save(workdir, read_metrics(workdir))

  def plot_curves_later(self) -> None:
    """:meth:`plot_curves` on a worker thread: the caller (the training
    loop, between epochs) does not wait for matplotlib (about 2 s at 200
    epochs). A redraw asked for while another waits to start is that one
    (it reads the newest records); :meth:`close` waits for the last."""
    if not self.enabled:
      return
    if self._plotter is None:
      self._plotter = futures.ThreadPoolExecutor(
          max_workers=1, thread_name_prefix="fkjax-curves")
    waiting = self._plot is not None and not (self._plot.running()
                                              or self._plot.done())
    if not waiting:
      self._plot = self._plotter.submit(self.plot_curves)

  def write_test(self, step: int, scalars: Mapping[str, float]) -> None:
    """Adds a test evaluation's scalars (``{tag: value}``) to TensorBoard,
    at the step of the checkpoint evaluated."""
    if not self.enabled:
      return
    if self._tb is None:
      # An evaluation restarts nothing: earlier scalars stay visible.
      self._tb = _EventFile(self._tb_dir, first_step=step, restart=False)
    self._tb.write_scalars(step, scalars)

  def close(self) -> None:
    """Closes TensorBoard's file; waits for a redraw of the curves (a
    failed one is said on stderr: the metrics are intact)."""
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._plotter is not None:
      self._plotter.shutdown(wait=True)
      self._plotter = None
      error = self._plot.exception()
      if error is not None:
        print(f"warning: could not draw the training curves: "
              f"{type(error).__name__}: {error}", file=sys.stderr)


_EVENT_FILES = itertools.count()


def _ends_with_newline(path: str) -> bool:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      if f.tell() == 0:
        return True
      f.seek(-1, os.SEEK_END)
      return f.read(1) == b"\n"
  except FileNotFoundError:
    return True


class _EventFile:
  """A TensorBoard event file written and fsync'd event by event."""

  def __init__(self, logdir: str, first_step: int, restart: bool = True):
    from tensorboardX.event_file_writer import EventsWriter  # slow import
    from tensorboardX.proto import event_pb2
    from tensorboardX import summary
    self._event_pb2 = event_pb2
    self._summary = summary
    resumed = restart and bool(
        glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    os.makedirs(logdir, exist_ok=True)
    # File names hold the time in seconds: the suffix keeps a quick restart
    # from reusing (and truncating) the previous writer's file.
    self._writer = EventsWriter(
        os.path.join(logdir, "events"),
        filename_suffix=f".{os.getpid()}.{next(_EVENT_FILES)}")
    if resumed:
      # TensorBoard drops earlier events at or after this step: scalars of an
      # epoch logged before a crash and logged again after the resume.
      # (The same two events as tensorboardX's ``purge_step``.)
      self._writer.write_event(event_pb2.Event(
          step=first_step, wall_time=time.time(),
          file_version="brain.Event:2"))
      self._writer.write_event(event_pb2.Event(
          step=first_step, wall_time=time.time(),
          session_log=event_pb2.SessionLog(
              status=event_pb2.SessionLog.START)))
    self._writer.flush()

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    now = time.time()
    for name, value in scalars.items():
      self._writer.write_event(self._event_pb2.Event(
          step=step, wall_time=now,
          summary=self._summary.scalar(name, float(value))))
    self._writer.flush()  # flush + fsync

  def close(self) -> None:
    self._writer.close()


def read_metrics(workdir: str, filename: str = "metrics.jsonl"
                 ) -> list[dict[str, Any]]:
  """The records of ``metrics.jsonl`` (or ``filename``, e.g. a copy kept
  under another name), one per epoch.

  A resumed run logs again the epochs after its checkpoint: the last record
  of each epoch (or step, for records without an epoch) wins. Sorted by
  epoch; a line cut short by a crash is skipped.
  """
  path = os.path.join(workdir, filename)
  if not os.path.exists(path):
    return []
  records: dict[tuple[str, Any], dict[str, Any]] = {}
  with open(path) as f:
    for line in f:
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut short by a crash (or a full disk)
      key = (("epoch", record["epoch"]) if "epoch" in record
             else ("step", record.get("step")))
      records[key] = record
  return sorted(records.values(),
                key=lambda r: (r.get("epoch", 0), r.get("step", 0)))


def format_epoch(m: Mapping[str, Any]) -> str:
  """One human-readable line per epoch."""
  parts = [f"epoch {m['epoch']}", f"lr {m['learning_rate']:.4g}"]
  special = ("train_seconds", "train_images_per_second")
  for k, v in m.items():
    if k.startswith(("train_", "val_")) and k not in special:
      parts.append(f"{k} {v:.4f}" if "loss" in k else f"{k} {v:.2f}")
  parts += [f"sparsity {m['weight_sparsity']:.2f}%",
            f"channel sparsity {m['channel_sparsity']:.2f}%",
            f"train {m['train_seconds']:.1f}s"]
  if m.get("train_images_per_second"):
    parts[-1] += f" ({m['train_images_per_second']:.0f} images/s)"
  return " | ".join(parts)


# --------------------------------------------------------------------------
# Progress.


def progress(iterable: Iterable[Any] | None, total: int | None = None,
             desc: str = "", *, initial: int = 0, unit: str = "it",
             disable: bool = False, leave: bool = True,
             stream: TextIO | None = None, interval: float = 30.0
             ) -> Any:
  """A progress display over ``iterable``: tqdm on a terminal, lines otherwise.

  On a terminal this is ``tqdm.tqdm(...)``. When ``stream`` (default
  ``sys.stderr``) is not a terminal, it returns a plain iterator that prints
  ``<desc>: <n>/<total> <unit>s (<percent>%), <elapsed>s, <rate> <unit>s/s,
  <[H:]MM:SS> left, <postfix>`` as one line at most every
  ``interval`` seconds and once at the end, so a redirected log has whole
  lines (``grep '^epoch' log``) instead of one carriage-return-joined line
  per epoch. The rate is the whole elapsed time's; the time left (shown
  while there is a total and some of it is left) uses the rate since the
  first update, since the first step of a jitted loop carries its
  compilation (often minutes on a CPU) and would inflate the estimate for
  the rest of the run. Both support ``set_postfix``, ``update`` and
  ``close``.

  Args:
    iterable: what to iterate over.
    total: its length, if known.
    desc: the line prefix (e.g. ``"epoch 3/200"``).
    initial: steps already done (a resumed epoch).
    unit: what one item is (``"step"``, ``"batch"``).
    disable: show nothing.
    leave: keep the tqdm bar when done (terminal only).
    stream: where to write (default ``sys.stderr``).
    interval: seconds between plain lines.
  """
  stream = sys.stderr if stream is None else stream
  if disable:
    return tqdm.tqdm(iterable, total=total, disable=True)
  isatty = getattr(stream, "isatty", None)
  if isatty is not None and isatty():
    return tqdm.tqdm(iterable, total=total, desc=desc, initial=initial,
                     unit=unit, leave=leave, file=stream)
  return PlainProgress(iterable, total=total, desc=desc, initial=initial,
                       unit=unit, stream=stream, interval=interval)


class PlainProgress:
  """Whole-line progress reports for logs (see ``progress``)."""

  def __init__(self, iterable: Iterable[Any] | None, total: int | None,
               desc: str, *, initial: int = 0, unit: str = "it",
               stream: TextIO | None = None, interval: float = 30.0):
    self._iterable = iterable
    self.total = total
    self.n = initial
    self._initial = initial
    self.desc = desc
    self._unit = unit
    self._stream = sys.stderr if stream is None else stream
    self._interval = interval
    self._start = time.monotonic()
    self._last_print = self._start
    self._postfix = ""
    self._closed = False
    self._printed: tuple[int, str] | None = None   # (n, postfix) last shown
    # (time, n) at the first update: the estimate's origin.
    self._first_update: tuple[float, int] | None = None

  def __iter__(self) -> Iterator[Any]:
    for item in self._iterable:
      yield item
      self.update(1)
    self.close()

  def __len__(self) -> int:
    return self.total if self.total is not None else len(self._iterable)

  def update(self, n: int = 1) -> None:
    self.n += n
    now = time.monotonic()
    if self._first_update is None:
      self._first_update = (now, self.n)
    if now - self._last_print >= self._interval:
      self._print(now)

  def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None,
                  refresh: bool = True, **kwargs: Any) -> None:
    del refresh  # lines are printed on schedule, not on change
    items = {**(ordered_dict or {}), **kwargs}
    self._postfix = ", ".join(f"{k}={v}" for k, v in items.items())

  def set_description(self, desc: str, refresh: bool = True) -> None:
    del refresh
    self.desc = desc

  def close(self) -> None:
    # The last update may have printed the final count already (its
    # interval had passed): the same line twice said nothing new.
    if not self._closed:
      self._closed = True
      if self.n > self._initial and self._printed != (self.n, self._postfix):
        self._print(time.monotonic())

  def _print(self, now: float) -> None:
    self._last_print = now
    self._printed = (self.n, self._postfix)
    done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
    pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
    elapsed = now - self._start
    rate = (self.n - self._initial) / elapsed if elapsed > 0 else 0.0
    parts = [f"{self.desc}: " if self.desc else "",
             f"{done} {self._unit}s{pct}, {elapsed:.0f}s, "
             f"{rate:.3g} {self._unit}s/s"]
    if self.total and self.n < self.total and self._first_update:
      since, n_since = self._first_update
      if self.n > n_since and now > since:
        steady = (self.n - n_since) / (now - since)
        left = tqdm.tqdm.format_interval((self.total - self.n) / steady)
        parts.append(f", {left} left")
    if self._postfix:
      parts.append(f", {self._postfix}")
    self._stream.write("".join(parts) + "\n")
    self._stream.flush()
