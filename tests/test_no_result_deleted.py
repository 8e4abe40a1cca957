"""No result is deleted: an evaluation made under other settings is kept in
the new file's ``"earlier"`` list (fkjax.evaluation.merge), and what a
killed write left is removed by the next writer (fkjax.atomic)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from fkjax import atomic
from fkjax.evaluation import merge as eval_merge


def _file(attacks, date, batch_size=100, checkpoint="best"):
  return {"attacks": {name: {"accuracy": 50.0, "correct": 8}
                      for name in attacks},
          "num_examples": 16,
          "metadata": {"date": date, "git_commit": "abc", "step": 12,
                       "checkpoint": checkpoint, "data": "d",
                       "protocol": "paper",
                       "config": {"eval": {"attacks": ",".join(attacks),
                                           "batch_size": batch_size,
                                           "checkpoint": checkpoint}}}}


def _new(*args, **kwargs):
  document = _file(*args, **kwargs)
  return document, document.pop("metadata")


def test_an_evaluation_under_other_settings_is_kept_beside_the_new():
  first = _file(["natural", "fgsm", "ifgsm20"], "2026-01-01")
  # Another batch size (same checkpoint and step), fewer attacks.
  new, metadata = _new(["natural"], "2026-01-02", batch_size=200)
  second, remark = eval_merge.merge(first, new, metadata)
  assert list(second["attacks"]) == ["natural"]
  kept = second["earlier"]
  assert [list(e["attacks"]) for e in kept] == [["natural", "fgsm",
                                                  "ifgsm20"]]
  assert kept[0]["metadata"]["config"]["eval"]["batch_size"] == 100
  assert "config.eval.batch_size 100, now 200" in remark
  assert "top level shows this evaluation's" in remark
  # The same attacks under another checkpoint name (same step): kept too,
  # the latest first, nothing nested.
  second["metadata"] = metadata
  new, metadata = _new(["natural"], "2026-01-03", batch_size=200,
                       checkpoint="latest")
  third, remark = eval_merge.merge(second, new, metadata)
  assert [e["metadata"]["date"] for e in third["earlier"]] == [
      "2026-01-02", "2026-01-01"]
  assert all("earlier" not in e for e in third["earlier"])
  assert "checkpoint 'best', now 'latest'" in remark
  # Redone under the same settings: replaced, the history carried over.
  third["metadata"] = metadata
  new, metadata = _new(["natural"], "2026-01-04", batch_size=200,
                       checkpoint="latest")
  fourth, remark = eval_merge.merge(third, new, metadata)
  assert remark is None
  assert fourth["earlier"] == third["earlier"]


def test_a_protocol_that_does_not_merge_attacks_keeps_the_earlier_too():
  first = _file(["apgd-ce"], "2026-01-01")
  new, metadata = _new(["apgd-ce"], "2026-01-02", batch_size=50)
  document, remark = eval_merge.merge(first, new, metadata,
                                      keep_attacks=False)
  assert document["earlier"][0]["metadata"]["date"] == "2026-01-01"
  assert remark is not None


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_a_killed_writers_staging_file_is_removed_by_the_next(tmp_path):
  target = tmp_path / "eval_paper.json"
  host = atomic._host()   # pylint: disable=protected-access
  dead = tmp_path / f".eval_paper.json.{host}.{_dead_pid()}.ab12cd34.tmp"
  # A live writer beside this one (another process, writing now).
  live_proc = subprocess.Popen([sys.executable, "-c",
                                "import time; time.sleep(60)"])
  try:
    live = tmp_path / f".eval_paper.json.{host}.{live_proc.pid}.zz99yy88.tmp"
    # Left by a writer from before staging names said their process: by
    # age only.
    old_style = tmp_path / ".eval_paper.json.k3j4h5g6.tmp"
    recent_old_style = tmp_path / ".eval_paper.json.a1b2c3d4.tmp"
    # Another file's staging file, and a user's file: not this writer's.
    other = tmp_path / f".final_eval.json.{host}.{_dead_pid()}.q1w2e3r4.tmp"
    mine = tmp_path / "notes.tmp"
    for path in (dead, live, old_style, recent_old_style, other, mine):
      path.write_text("{")
    long_ago = time.time() - atomic.STALE_SECONDS - 60
    os.utime(old_style, (long_ago, long_ago))
    atomic.write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([target.name, live.name, recent_old_style.name,
                           other.name, mine.name])
  finally:
    live_proc.kill()
    live_proc.wait()


def test_staging_names_say_their_process(tmp_path, monkeypatch):
  seen = []
  real_replace = os.replace

  def replace(src, dst):
    seen.append(os.path.basename(src))
    return real_replace(src, dst)

  monkeypatch.setattr(os, "replace", replace)
  atomic.write_text(tmp_path / "x.json", "{}")
  host = atomic._host()   # pylint: disable=protected-access
  assert seen[0].startswith(f".x.json.{host}.{os.getpid()}.")
