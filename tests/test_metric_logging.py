"""metrics.jsonl, TensorBoard event files and progress output."""
from __future__ import annotations

import io
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tqdm
from tensorboardX.proto import event_pb2

from fkjax.workdir import metric_logging
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]


def _events(logdir):
  """All events of the TFRecord event files in ``logdir``, file by file."""
  files = sorted(Path(logdir).glob("events.out.tfevents.*"),
                 key=lambda p: p.stat().st_mtime_ns)
  out = []
  for path in files:
    data = path.read_bytes()
    events, pos = [], 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      payload = data[pos + 12:pos + 12 + length]
      if len(payload) < length:
        break
      events.append(event_pb2.Event.FromString(payload))
      pos += 12 + length + 4
    out.append(events)
  return out


def _scalars(events):
  return {(e.step, v.tag): v.simple_value
          for e in events for v in e.summary.value}


_KILLED = textwrap.dedent("""
    import os, signal, sys
    from fkjax.workdir import metric_logging
    logger = metric_logging.MetricLogger(sys.argv[1])
    for epoch in (1, 2):
      logger.write(4 * epoch, {"epoch": epoch, "train_loss": 1.0 / epoch})
    os.kill(os.getpid(), signal.SIGKILL)  # no close(), no exit handlers
""")


def test_kill_after_write_keeps_the_epoch(tmp_path):
  proc = subprocess.run([sys.executable, "-c", _KILLED, str(tmp_path)],
                        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                        capture_output=True, text=True, timeout=TIMEOUT_S)
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  records = metric_logging.read_metrics(str(tmp_path))
  assert [r["epoch"] for r in records] == [1, 2]
  (events,) = _events(tmp_path / "tensorboard")
  assert _scalars(events) == {(4, "epoch"): 1.0, (4, "train_loss"): 1.0,
                              (8, "epoch"): 2.0, (8, "train_loss"): 0.5}


def test_resumed_epoch_is_read_once_and_purged_in_tensorboard(tmp_path):
  first = metric_logging.MetricLogger(str(tmp_path))
  for epoch in (1, 2):
    first.write(4 * epoch, {"epoch": epoch, "val_accuracy": 0.1 * epoch})
  first.close()
  # Killed before epoch 2's checkpoint: the resumed run logs it again.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"epoch": 3, "val_acc')  # and a line cut short by a crash
  again = metric_logging.MetricLogger(str(tmp_path))
  again.write(8, {"epoch": 2, "val_accuracy": 0.25})
  again.write(12, {"epoch": 3, "val_accuracy": 0.3})
  again.close()
  records = metric_logging.read_metrics(str(tmp_path))
  assert [(r["epoch"], r["val_accuracy"]) for r in records] == [
      (1, 0.1), (2, 0.25), (3, 0.3)]
  old, new = _events(tmp_path / "tensorboard")
  restarts = [e.step for e in new if e.HasField("session_log")
              and e.session_log.status == event_pb2.SessionLog.START]
  assert restarts == [8]  # TensorBoard drops old events from step 8 on
  assert _scalars(old)[(8, "val_accuracy")] == pytest.approx(0.2)
  assert _scalars(new)[(8, "val_accuracy")] == 0.25
  assert not any(e.HasField("session_log") for e in old)


def test_disabled_logger_writes_nothing(tmp_path):
  logger = metric_logging.MetricLogger(str(tmp_path), enabled=False)
  logger.write(1, {"epoch": 1})
  logger.close()
  assert list(tmp_path.iterdir()) == []


class _Stream(io.StringIO):

  def __init__(self, tty):
    super().__init__()
    self._tty = tty

  def isatty(self):
    return self._tty


def test_progress_prints_whole_lines_when_not_a_terminal():
  stream = _Stream(tty=False)
  bar = metric_logging.progress(range(6), total=8, desc="epoch 2/5",
                                initial=2, unit="step", stream=stream,
                                interval=0)
  seen = []
  for i in bar:
    seen.append(i)
    bar.set_postfix({"loss": f"{1.0 / (i + 1):.3f}"})
  bar.close()
  assert seen == list(range(6))
  text = stream.getvalue()
  assert "\r" not in text and text.endswith("\n")
  lines = text.splitlines()
  # One a step (interval 0); closing repeats none (the last said 8/8 with
  # this postfix already).
  assert len(lines) == 6
  assert all(l.startswith("epoch 2/5: ") for l in lines)
  assert lines[0].startswith("epoch 2/5: 3/8 steps (38%)")
  assert lines[-1].startswith("epoch 2/5: 8/8 steps (100%)")
  assert lines[-1].endswith("loss=0.167")


def test_progress_lines_say_the_time_left_at_the_rate_after_compiling(
    monkeypatch):
  # The first step takes 30 s (it compiles), every later one 2 s.
  clock = iter([0] + list(range(30, 1000, 2)))
  monkeypatch.setattr(metric_logging.time, "monotonic", lambda: next(clock))
  stream = _Stream(tty=False)
  for _ in metric_logging.progress(range(6), total=8, desc="epoch 2/5",
                                   initial=2, unit="step", stream=stream,
                                   interval=0):
    pass
  lines = stream.getvalue().splitlines()
  # One step done, and it compiled: no rate to estimate from yet.
  assert lines[0] == "epoch 2/5: 3/8 steps (38%), 30s, 0.0333 steps/s"
  # 4 steps left at 0.5 steps/s since then, not at the 0.0625 of the
  # whole 32 s (which would say 01:04).
  assert lines[1] == ("epoch 2/5: 4/8 steps (50%), 32s, 0.0625 steps/s, "
                      "00:08 left")
  assert lines[4].endswith("7/8 steps (88%), 38s, 0.132 steps/s, 00:02 left")
  assert lines[-1].endswith("8/8 steps (100%), 40s, 0.15 steps/s")
  # No total, no estimate.
  stream = _Stream(tty=False)
  for _ in metric_logging.progress(iter(range(2)), stream=stream,
                                   interval=0):
    pass
  assert "left" not in stream.getvalue()


def test_an_epochs_last_line_is_printed_once_in_a_log(monkeypatch):
  # The epoch's last step came 30 s after the previous line: its update
  # printed 16/16, and closing printed the same line again.
  clock = iter([0, 62, 94, 140, 140, 140])
  monkeypatch.setattr(metric_logging.time, "monotonic", lambda: next(clock))
  stream = _Stream(tty=False)
  bar = metric_logging.progress(range(3), total=3, desc="epoch 1/3",
                                unit="step", stream=stream, interval=30)
  for i in bar:
    bar.set_postfix({"loss": f"{2.3 - i / 10:.3f}"})
  bar.close()
  lines = stream.getvalue().splitlines()
  assert [l.split(",")[0] for l in lines] == [
      "epoch 1/3: 1/3 steps (33%)", "epoch 1/3: 2/3 steps (67%)",
      "epoch 1/3: 3/3 steps (100%)"]
  assert lines[-1].endswith("loss=2.100")


def test_progress_is_quiet_between_intervals():
  stream = _Stream(tty=False)
  for _ in metric_logging.progress(range(50), total=50, desc="eval",
                                   stream=stream, interval=3600):
    pass
  (line,) = stream.getvalue().splitlines()  # only the final line
  assert line.startswith("eval: 50/50 its (100%)")


def test_progress_is_tqdm_on_a_terminal_and_silent_when_disabled():
  bar = metric_logging.progress(range(3), total=3, desc="x",
                                stream=_Stream(tty=True))
  assert isinstance(bar, tqdm.tqdm)
  assert list(bar) == [0, 1, 2]
  stream = _Stream(tty=False)
  assert list(metric_logging.progress(range(3), disable=True,
                                      stream=stream)) == [0, 1, 2]
  assert stream.getvalue() == ""
