"""Adding a setting never invalidates what ran (fkjax.config.history).

The runs committed under results/ were saved before ``precision`` existed
and before APGD-T joined the strong protocol: they must stay finished, be
reported, and never train again. Nothing here trains or writes under
results/ (the report runs on a copy).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from configs import default as default_config
from fkjax.config import history
from fkjax.config import record as run_config
from fkjax import workdir as workdir_lib
from reproduce import __main__ as reproduce_main
from reproduce.run import archive as archive_lib
from reproduce.run import estimate as estimate_lib
from reproduce.run import execute as execute_lib
from reproduce.run import plan as plan_lib
from reproduce.run import runs as runs_lib
from reproduce.run import standing as standing_lib
from reproduce.run import sweeps as sweeps_lib
from reproduce.spec import scales
from reproduce.spec import tables

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
# (scale name as the results folder says, the scale)
SCALES = (("cpu", scales.SCALES["cpu"]),
          ("cpu-long", scales.with_variant(scales.SCALES["cpu"], "long")))


def _committed(tmp_path):
  """(folder under results/, the run as its kept copy shows it) for every
  run committed under results/cpu*/runs, read in place: those of each
  table's seeds, and of more seeds run with --seeds."""
  out, seen = [], set()
  for folder, scale in SCALES:
    for name in tables.ORDER:
      # sync=False: nothing is restored nor copied (a dry run's reading).
      for run in plan_lib.plan(tables.TABLES[name], scale,
                               root=str(tmp_path / "w"), seeds=5,
                               results=str(RESULTS), sync=False):
        view = standing_lib.status_view(run)
        if view.workdir != run.workdir and view.workdir not in seen:
          seen.add(view.workdir)
          out.append((folder, view))
  return out


def _kept_records(folder):
  return {os.path.dirname(p) for p in glob.glob(
      str(RESULTS / folder / "runs" / "*" / "*" / archive_lib.RUN_RECORD))}


def test_every_committed_run_is_finished(tmp_path):
  runs = _committed(tmp_path)
  for folder, _ in SCALES:
    # every kept run is one the tables plan (none is left unchecked)
    assert {r.workdir for f, r in runs if f == folder} == _kept_records(
        folder)
  assert len(runs) > 80
  for _, run in runs:
    assert standing_lib.finished(run), (run.workdir,
                                        standing_lib.status_of(run))
    standing = standing_lib.standings(run)
    assert standing["train"] == (), run.workdir
    assert standing["eval"] == (), run.workdir
  # The strong evaluations predate APGD-T in it: made with the older
  # default, named as such, and never pending.
  strong = [r for _, r in runs
            if "eval_strong" in standing_lib.older_settings(r)]
  assert len(strong) >= 14
  for run in strong:
    assert standing_lib.pending_evals(run) == []
    (note,) = standing_lib.older_settings(run)["eval_strong"]
    assert note.startswith("eval.strong.targeted=False, the default before "
                           "2026-12-03")


def test_a_key_added_to_the_schema_keeps_committed_runs_finished(
    tmp_path, monkeypatch):
  # A contributor adds a training key: listed in history with the value
  # that reproduces the runs before it, every committed run stays
  # finished and current; listed with another value than the one the
  # tables now ask, its runs are finished, marked as trained with the older
  # default (never trained again); not listed at all, it is read as it ran.
  key = "training.new_knob"
  monkeypatch.setitem(default_config.DEFAULTS, key, 7)
  listed = history.Change(key, "2027-01-01", 7, "a knob added")
  monkeypatch.setattr(history, "CHANGES", (*history.CHANGES, listed))
  runs = _committed(tmp_path)
  assert runs and all(run_config.flatten(
      run_config.as_dict(r.config))[key] == 7 for _, r in runs)
  for _, run in runs:
    assert standing_lib.finished(run), standing_lib.status_of(run)
    assert standing_lib.standings(run)["train"] == ()

  older = history.Change(key, "2027-01-01", 3, "a knob added")
  monkeypatch.setattr(history, "CHANGES", (*history.CHANGES[:-1], older))
  for _, run in runs:
    assert standing_lib.finished(run)
    (note,) = standing_lib.standings(run)["train"]
    assert note.startswith(f"{key}=3, the default before 2027-01-01")
    assert "train" not in standing_lib.evals_to_run(run)

  monkeypatch.setattr(history, "CHANGES", history.CHANGES[:-1])
  for _, run in runs:
    assert standing_lib.finished(run)
    assert standing_lib.standings(run)["train"] == ()


def test_a_changed_training_setting_still_trains_again(tmp_path):
  # The other side: a row whose training differs from what ran, in a key
  # that history does not list, is not finished.
  _, run = _committed(tmp_path)[0]
  assert standing_lib.finished(run)
  config = run.config.copy_and_resolve_references()
  config.training.num_epochs += 1
  changed = dataclasses.replace(run, config=config)
  assert not standing_lib.finished(changed)
  assert standing_lib.status_of(changed).startswith("to update")


def test_a_changed_evaluation_setting_never_trains_again(tmp_path):
  # Another main evaluation (fewer test images, say) is an evaluation to
  # run again; the training stays finished.
  _, run = _committed(tmp_path)[0]
  config = run.config.copy_and_resolve_references()
  config.eval.num_examples = 1000
  changed = dataclasses.replace(run, config=config)
  assert standing_lib.finished(changed)
  assert standing_lib.standings(changed)["train"] == ()
  assert standing_lib.evals_to_run(changed)[0] == "eval"
  assert standing_lib.status_of(changed).startswith("done, eval not yet run")


def test_every_key_the_committed_records_lack_is_in_history(tmp_path):
  # What a key added since reads as must be said, not guessed: every
  # setting (but where and how a run executes) that a committed run's
  # config.json lacks is listed in fkjax/config/history.py.
  listed = {c.key for c in history.CHANGES}
  lacking = set()
  for _, run in _committed(tmp_path):
    saved = run_config.flatten(run_config.load_saved(run.workdir))
    now = run_config.flatten(run_config.as_dict(run.config))
    lacking |= {k for k in now if k not in saved
                and not run_config.is_environment_key(k)}
  assert "precision" in lacking
  assert lacking <= listed, sorted(lacking - listed)


def test_a_dry_run_of_the_committed_cpu_scale_has_nothing_to_retrain(
    tmp_path, monkeypatch, capsys):
  # A dry run reads files only: nothing builds a model, trains or
  # evaluates, nothing is restored into a workdir.
  from fkjax.training import build  # pylint: disable=C0415

  def never(*args, **kwargs):
    raise AssertionError("a dry run ran something")
  for module, name in ((execute_lib, "execute"),
                       (sweeps_lib, "train_in_sweeps"),
                       (build.Experiment, "build")):
    monkeypatch.setattr(module, name, never)
  capsys.readouterr()
  assert reproduce_main.main(["all", "--scale=cpu", "--dry-run",
                              f"--root={tmp_path / 'w'}",
                              f"--results={RESULTS}"]) == 0
  out = capsys.readouterr().out
  assert "to update" not in out
  left = dict(re.findall(r"^# (\w+): ~(\S+) left to run", out, re.M))
  assert set(left) == set(tables.ORDER)
  # Table 7 has not run at the cpu scale; every other table is finished.
  assert {t for t, s in left.items() if s != "0m00s"} == {"table7"}
  statuses = re.findall(
      r"^- (\S+) seed \d+(?: \(shared: [^)]*\))?: ([^,~]+)", out, re.M)
  assert len(statuses) > 100
  assert {s for _, s in statuses} == {"done", "not started"}
  assert all(s == "done" for row, s in statuses
             if row not in tables.TABLES["table7"].row_names)
  assert "eval_strong made with eval.strong.targeted=False" in out
  assert not (tmp_path / "w").exists()   # nothing restored


@pytest.mark.slow
def test_report_only_keeps_every_finished_row(tmp_path, capsys):
  # On a copy of results/cpu: every row finished before is finished after,
  # with the same numbers; only the strong column gains its mark. The
  # runs' kept files are not touched.
  results = tmp_path / "results"
  shutil.copytree(RESULTS / "cpu", results / "cpu")
  before = json.loads((results / "cpu" / "table1.json").read_text())
  kept = {p: Path(p).read_bytes() for p in glob.glob(
      str(results / "cpu" / "runs" / "**" / "*"), recursive=True)
          if os.path.isfile(p)}
  capsys.readouterr()
  assert reproduce_main.main(["table1", "--scale=cpu", "--report-only",
                              f"--root={tmp_path / 'w'}",
                              f"--results={results}"]) == 0
  after = json.loads((results / "cpu" / "table1.json").read_text())
  assert [r["name"] for r in after["rows"]] == [
      r["name"] for r in before["rows"]]
  for old, new in zip(before["rows"], after["rows"]):
    assert [e["status"] for e in new["runs"]] == [
        e["status"] for e in old["runs"]] == ["done"] * 3
    assert new["summary"] == old["summary"]
    assert set(new["older"]) == {"A_strong"}
  md = (results / "cpu" / "table1.md").read_text()
  assert "not yet run" not in md
  assert md.count("made with eval.strong.targeted=False") > 8
  rows = [l for l in md.splitlines() if l.startswith("| ResNet20")
          or l.startswith("| En2ResNet20")]
  assert len(rows) == 8 and all("†" in l for l in rows)
  claims = (results / "cpu" / "claims.md").read_text()
  assert claims == (RESULTS / "cpu" / "claims.md").read_text()
  assert (results / "cpu" / "overview.md").read_text() == (
      RESULTS / "cpu" / "overview.md").read_text()
  now = {p for p in glob.glob(str(results / "cpu" / "runs" / "**" / "*"),
                              recursive=True) if os.path.isfile(p)}
  assert now == set(kept)
  assert all(Path(p).read_bytes() == data for p, data in kept.items())


def test_the_docs_time_table_is_the_tools(tmp_path):
  # docs/reproduction.md's "cpu time, 1 seed / all seeds" column and its
  # totals are what python -m reproduce all --scale=cpu --dry-run prints
  # "from scratch".
  text = (REPO / "docs" / "reproduction.md").read_text()
  scale = scales.SCALES["cpu"]
  everything = {name: None for name in tables.ORDER}
  one = estimate_lib.from_scratch_seconds(everything, scale, seeds=1)
  every = estimate_lib.from_scratch_seconds(everything, scale)
  cells = dict(re.findall(r"^\| `(\w+)` \|.*\| ([^|]+ / [^|]+) \|$", text,
                          re.M))
  assert cells == {n: f"{estimate_lib.format_seconds(one[n])} / "
                      f"{estimate_lib.format_seconds(every[n])}"
                   for n in tables.ORDER}
  assert (f"in total about {round(sum(one.values()) / 3600)} hours with "
          f"`--seeds=1`, {round(sum(every.values()) / 3600)} with the "
          "tables' seeds") in " ".join(text.split())


def test_an_untargeted_strong_result_never_passes_for_a_targeted_one(
    tmp_path):
  # A result named before subsets said _n<N> is found (and adopted) under
  # today's name only where what it records is named so today.
  config = default_config.get_config()
  config.eval.protocol = "strong"
  config.eval.num_examples = 200
  recorded = run_config.as_dict(config)
  recorded["eval"]["strong"]["targeted"] = False
  (tmp_path / "eval_strong.json").write_text(json.dumps(
      {"metadata": {"config": recorded}}))
  assert workdir_lib.existing_eval_result(tmp_path, config) is None
  assert not workdir_lib.adopt_subset_result(tmp_path, config)
  # nor, named before untargeted results said so, for an untargeted one
  config.eval.strong.targeted = False
  assert workdir_lib.existing_eval_result(tmp_path, config) is None
  (tmp_path / "eval_strong.json").rename(
      tmp_path / "eval_strong_untargeted.json")
  assert workdir_lib.existing_eval_result(tmp_path, config) == str(
      tmp_path / "eval_strong_untargeted.json")
  assert workdir_lib.adopt_subset_result(tmp_path, config)
  assert (tmp_path / "eval_strong_n200_untargeted.json").exists()
  assert workdir_lib.eval_result_path(tmp_path, config) == str(
      tmp_path / "eval_strong_n200_untargeted.json")


def test_a_missing_key_reads_as_the_value_that_reproduced_the_run():
  saved = {"training": {"batch_size": 128}, "eval": {"protocol": "paper"}}
  done = history.complete(saved)
  assert done["precision"] == "float32"
  assert done["eval"]["strong"]["targeted"] is False
  assert "strong" not in saved["eval"]   # a copy
  now = {**saved, "precision": "bfloat16"}
  assert run_config.differences(saved, now) == [
      ("precision", "float32", "bfloat16")]
  assert run_config.differences(saved, {**saved, "precision": "float32"}) == []
  assert history.older("eval.strong.targeted", False, True).date == (
      "2026-12-03")
  assert history.older("eval.strong.targeted", True, False) is None
  assert history.older("training.batch_size", 64, 128) is None


def test_an_evaluation_made_with_an_older_default_runs_again_only_where_it_can(
    tmp_path):
  # A run whose strong evaluation predates APGD-T in it: reported as made,
  # never pending; with checkpoints in its workdir the runner evaluates it
  # again (the training stays), without them it reports it as it is.
  run = plan_lib.plan(tables.TABLES["table1"], scales.SCALES["tiny"],
                      rows=["resnet20_none"], seeds=1,
                      root=str(tmp_path / "w"))[0]
  (strong,) = run.extra_evals
  assert run.config.eval.strong.targeted is True
  os.makedirs(run.workdir)
  run_config.save(run.config, run.workdir)
  older = runs_lib.with_overrides(run.config, {**strong.overrides,
                                               "eval.strong.targeted": False})
  recorded = run_config.as_dict(older)
  name = os.path.basename(workdir_lib.eval_result_path("", older))
  Path(run.workdir, name).write_text(json.dumps(
      {"metadata": {"config": recorded}}))
  now = standing_lib.fingerprints(run)
  record = {"done": True, "fingerprints": {
      "train": now["train"], "eval": now["eval"],
      "eval_strong": standing_lib._fingerprint(   # pylint: disable=W0212
          standing_lib._computed(recorded, True))}}   # pylint: disable=W0212
  assert record["fingerprints"]["eval_strong"] != now["eval_strong"]
  Path(run.workdir, archive_lib.RUN_RECORD).write_text(json.dumps(record))

  assert standing_lib.finished(run) and standing_lib.pending_evals(run) == []
  assert standing_lib.evals_to_run(run) == ["eval_strong"]
  assert standing_lib.status_of(run).startswith(
      "done, eval_strong made with eval.strong.targeted=False")
  assert standing_lib.kept_result(run, strong, record["fingerprints"][
      "eval_strong"]).result_file == name
  assert reproduce_main._todo("table1", [run], False) == []   # pylint: disable=W0212
  os.makedirs(os.path.join(run.workdir, "checkpoints", "1"))
  assert reproduce_main._todo("table1", [run], False) == [run]   # pylint: disable=W0212
  assert reproduce_main._todo("table1", [run], True) == []   # pylint: disable=W0212
  # another strong setting, not a default history lists: pending
  record["fingerprints"]["eval_strong"] = "0" * 16
  Path(run.workdir, archive_lib.RUN_RECORD).write_text(json.dumps(record))
  assert standing_lib.pending_evals(run) == [strong]


def test_a_value_the_table_asks_for_itself_is_another_run(tmp_path,
                                                         monkeypatch):
  # A row that sets an added key to a value of its own (not today's
  # default) asks for another run than the records made before the key:
  # those train again.
  _, run = _committed(tmp_path)[0]
  config = run.config.copy_and_resolve_references()
  config.precision = "bfloat16"
  asks = dataclasses.replace(run, config=config)
  assert not standing_lib.finished(asks)
  # the same value as today's default: made before it, kept and marked
  monkeypatch.setitem(default_config.DEFAULTS, "precision", "bfloat16")
  assert standing_lib.finished(asks)
  (note,) = standing_lib.standings(asks)["train"]
  assert note.startswith("precision='float32', the default before 2026-12-07")
