"""Tests of the table runner (reproduce) at the tiny scale.

The runner runs as a real ``python -m reproduce`` process, so that it
can be killed with SIGKILL in the middle of a row and rerun. The runs share a
persistent compilation cache, so only the first run of each program pays for
compilation.
"""
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from fkjax import pretrained
from fkjax.checkpoint import weights_file
from fkjax.config import record as run_config
from fkjax.evaluation import journal as eval_journal
from fkjax import workdir as workdir_lib
from fkjax.training import precision
from reproduce import __main__ as reproduce_main
from reproduce.report import report
from reproduce.run import archive as archive_lib
from reproduce.run import estimate as estimate_lib
from reproduce.run import execute as execute_lib
from reproduce.run import plan as plan_lib
from reproduce.run import records as records_lib
from reproduce.run import standing as standing_lib
from reproduce.run import weights
from reproduce.spec import scales
from reproduce.spec import tables
from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
PAPER_TEX = REPO.parent / "shared" / "paper.tex"


def _env(cache_dir):
  env = dict(os.environ)
  env.update({
      "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
      "PYTHONUNBUFFERED": "1",
      "PYTHONPATH": str(REPO),
  })
  return env


def _reproduce(args, root, cache, check=True):
  proc = subprocess.run(
      [sys.executable, "-m", "reproduce", *args,
       f"--root={root / 'w'}", f"--results={root / 'results'}"],
      cwd=REPO, env=_env(cache), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  if check and proc.returncode != 0:
    raise AssertionError(f"runner failed:\n{proc.stdout}\n{proc.stderr}")
  return proc


def _reproduce_here(args, root, capsys, check=True):
  """:func:`_reproduce` in this process, for what starts no JAX (dry runs,
  errors): a process costs seconds of imports."""
  capsys.readouterr()
  try:
    code = reproduce_main.main([*args, f"--root={root / 'w'}",
                                f"--results={root / 'results'}"])
  except SystemExit as e:
    code = e.code
  out = capsys.readouterr()
  if check and code != 0:
    raise AssertionError(f"runner failed:\n{out.out}\n{out.err}")
  return subprocess.CompletedProcess(args, code, out.out, out.err)


# --------------------------------------------------------------------------
# Table definitions and commands (no training).


def _paper_block(tex, label):
  """The LaTeX of the table holding ``\\label{label}``."""
  at = tex.index("\\label{" + label)
  start = tex.rfind("\\begin{table", 0, at)
  end = tex.find("\\end{table", at)
  return tex[start:end]


_LABELS = {"table1": "Table:Acc:Unstructured", "table2": "Tab:rvsm:channel",
           "table3": "Tab:En2resnet20vsResNet38",
           "table4": "Tab:RVSM-ADMM-comparison",
           "table5": "Tab:ResNetNoSkip}",   # not ...-Sparsity
           "table6": "Tab:ResNetNoSkip-Sparsity",
           "table7": "Tab:RvsmCifar100"}


def _number_pattern(value):
  if value == 0:
    return r"\b0(?:\.0+)?\b"
  text = f"{value:.2f}"
  short = text.rstrip("0").rstrip(".")
  return r"\b(?:" + re.escape(text) + "|" + re.escape(short) + r")\b"


@pytest.mark.skipif(not PAPER_TEX.exists(), reason="no shared/paper.tex")
@pytest.mark.parametrize("name", sorted(_LABELS))
def test_paper_numbers_are_the_papers_rows(name):
  """Each row's numbers appear, in column order, on one line of the paper's
  table (Table 4's lines hold two rows' worth: both are checked there)."""
  tex = PAPER_TEX.read_text()
  block = _paper_block(tex, _LABELS[name])
  lines = [l for l in block.splitlines() if "&" in l]
  order = ("A1", "A2", "A3", "A4", "A5", "sparsity", "channel_sparsity")
  for row in tables.TABLES[name].rows:
    values = [row.paper[k] for k in order if row.paper.get(k) is not None]
    assert len(values) >= 4, row.name
    pattern = r".*?".join(_number_pattern(v) for v in values)
    assert any(re.search(pattern, line) for line in lines), (
        f"{name}/{row.name}: {values} not found in order in the paper")


@pytest.mark.skipif(not PAPER_TEX.exists(), reason="no shared/paper.tex")
def test_sec3_shares_are_the_papers():
  tex = PAPER_TEX.read_text()
  assert "8.66\\% and 3.64\\%" in tex
  sec3 = tables.TABLES["sec3"]
  assert sec3.row("resnet20_nt").paper["small_share"] == 8.66
  assert sec3.row("resnet20_at").paper["small_share"] == 3.64


def _scales():
  """Every scale, and every scale under every variant."""
  out = dict(scales.SCALES)
  for variant, v in scales.VARIANTS.items():
    for name in v.get("scales", scales.SCALES):
      out[f"{name}-{variant}"] = scales.with_variant(scales.SCALES[name],
                                                     variant)
  return out


SCALES = _scales()


@functools.cache
def _plans(scale, seeds=1):
  """Every table's runs at ``scale`` under ``--root=w``, planned once for
  the tests that only read them (every table's plan costs seconds)."""
  return {name: plan_lib.plan(table, SCALES[scale], root="w", seeds=seeds)
          for name, table in tables.TABLES.items()}


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_every_row_builds_and_shared_rows_match_their_owner(scale):
  seen = {}
  for table in tables.TABLES.values():
    runs = _plans(scale)[table.name]
    assert [r.row.name for r in runs] == [r.name for r in table.rows]
    for run in runs:
      # a shared row runs in its owner's workdir, with the owner's config
      if run.row.shared:
        assert run.owner_table != table.name
        assert f"/{run.owner_table}/" in run.workdir
      seen.setdefault(run.workdir, run.train_command)
      assert seen[run.workdir] == run.train_command
      run_config.validate(run.config)   # the scale fits every row


def _parse_train_command(command, monkeypatch):
  """The config train.py would build from ``command``'s flags."""
  argv = shlex.split(command)[1:]   # drop "python"; argv[0] is train.py
  # config_flags reads the overrides from sys.argv, as in train.py
  monkeypatch.setattr(sys, "argv", argv)
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values,
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  values(argv)
  return values.config, values.workdir


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_commands_build_the_runs_config(scale, monkeypatch):
  """train.py given a run's recorded command builds exactly its config."""
  monkeypatch.chdir(REPO)
  for table in tables.TABLES.values():
    for run in _plans(scale)[table.name]:
      config, workdir = _parse_train_command(run.train_command,
                                             monkeypatch)
      assert workdir == run.workdir
      want = scales.flat(run.config)
      # train.py resolves precision "auto" for its platform before it
      # records the run, as the plan does.
      got = scales.flat(precision.resolved(config))
      for key in ("progress", "compilation_cache_dir"):
        want.pop(key), got.pop(key)
      assert got == want, (table.name, run.row.name)


@pytest.mark.parametrize("scale, variant", [
    tuple(name.split("-")) for name in sorted(SCALES) if "-" in name])
def test_a_variant_runs_at_its_base_scales_budget(scale, variant):
  """Seeds per row and the extra evaluations' budgets (NAttack's A5, the
  strong protocol) are the base scale's: cpu-authors once ran En5ResNet20
  rows on 3 seeds and NAttack at the paper's size (hours per row)."""
  for table in tables.TABLES.values():
    want = _plans(scale, seeds=None)[table.name]
    got = _plans(f"{scale}-{variant}", seeds=None)[table.name]
    assert ([(r.row.name, r.seed) for r in got]
            == [(r.row.name, r.seed) for r in want]), table.name
    for a, b in zip(want, got):
      assert ([(e.protocol, e.overrides) for e in b.extra_evals]
              == [(e.protocol, e.overrides) for e in a.extra_evals]), (
                  table.name, a.row.name, a.seed)


@pytest.mark.parametrize("presets, overrides", [
    ("resnet20,none", {}),
    ("en2resnet20,rgsm", {"sparsity.lamb1": 0.1}),
    ("resnet20,rvsm", {"sparsity.beta": 0.01, "sparsity.lamb": 1e-6}),
    ("resnet20,admm", {"sparsity.structure": "channel"})])
def test_the_long_variant_doubles_the_cpu_schedule_at_half_its_decay(
    presets, overrides):
  cpu = scales.build_config(presets, overrides, scales.SCALES["cpu"], 0)
  long = scales.build_config(presets, overrides, SCALES["cpu-long"], 0)
  assert long.training.num_epochs == 2 * cpu.training.num_epochs
  assert tuple(long.training.lr_boundaries) == tuple(
      2 * b for b in cpu.training.lr_boundaries)
  assert long.training.weight_decay == pytest.approx(
      cpu.training.weight_decay / 2)
  # the same summed decay: what prunes a channel or a weight
  assert (scales.learning_rate_sum(long) * long.training.weight_decay
          == pytest.approx(scales.learning_rate_sum(cpu)
                           * cpu.training.weight_decay))
  paper = scales.build_config(presets, overrides, scales.SCALES["paper"], 0)
  s, p = long.sparsity, paper.sparsity
  if s.method == "rgsm":
    assert s.lamb1 == pytest.approx(p.lamb1 * 4 ** -0.5)
    assert s.lamb2 == pytest.approx(p.lamb2 * 4)
  if s.method == "rvsm":
    assert s.lamb == pytest.approx(p.lamb * 4 ** -0.5)
  if s.method == "admm":
    assert s.rho == pytest.approx(p.rho * 4)
  # everything else is the cpu scale's
  differ = {k for k, v in scales.flat(long).items()
            if scales.flat(cpu).get(k) != v}
  assert differ <= {"training.num_epochs", "training.lr_boundaries",
                    "training.weight_decay", "sparsity.lamb1",
                    "sparsity.lamb2", "sparsity.lamb", "sparsity.rho"}
  assert SCALES["cpu-long"].description.startswith(
      "2 CPU cores, the long variant")


@pytest.mark.parametrize("scale", ["paper", "tiny"])
def test_the_long_variant_exists_for_the_cpu_scale_only(scale):
  with pytest.raises(ValueError, match="for the cpu scale only"):
    scales.with_variant(scales.SCALES[scale], "long")


def test_shrinkage_factor_matches_the_schedules():
  paper = scales.build_config("resnet20,none", {}, scales.SCALES["paper"], 0)
  assert scales.shrinkage_factor(paper) == pytest.approx(1.0)
  cpu = scales.build_config("resnet20,none", {}, scales.SCALES["cpu"], 0)
  # 45,000 images in 352 batches: 80, 40, 40, 40 epochs at lr 0.1 .. 1e-4
  # in the paper, 2, 1, 1, 1 epochs at the cpu scale.
  k = ((80 * 0.1 + 40 * 0.01 + 40 * 1e-3 + 40 * 1e-4)
       / (2 * 0.1 + 0.01 + 1e-3 + 1e-4))
  assert scales.shrinkage_factor(cpu) == pytest.approx(k)


@pytest.mark.parametrize("multiplier", [1.0, 8.0, scales.FULL])
@pytest.mark.parametrize("presets,overrides,lamb", [
    ("resnet20,rvsm", {"sparsity.beta": 0.01}, "lamb"),
    ("resnet20,rgsm", {"sparsity.lamb1": 0.1}, "lamb1")])
def test_decay_multiplier_scales_decay_and_thresholds(multiplier, presets,
                                                      overrides, lamb):
  scale = scales.with_multiplier(scales.SCALES["cpu"], multiplier)
  c = scales.build_config(presets, overrides, scale, 0)
  p = scales.build_config(presets, overrides, scales.SCALES["paper"], 0)
  m = (scales.shrinkage_factor(c) if multiplier == scales.FULL
       else multiplier)
  assert c.training.weight_decay == pytest.approx(5e-4 * m, rel=1e-3)
  assert c.sparsity.beta == p.sparsity.beta

  def threshold(config):
    return (2 * config.sparsity[lamb] / config.sparsity.beta) ** 0.5
  assert threshold(c) == pytest.approx(threshold(p) * m ** -0.25, rel=1e-3)
  if lamb == "lamb1":
    assert c.sparsity.lamb2 == pytest.approx(1e-5 * m, rel=1e-3)


@pytest.mark.parametrize("multiplier", [1.0, 8.0])
@pytest.mark.parametrize("structure", ["element", "channel"])
def test_decay_multiplier_scales_the_admm_pull(multiplier, structure):
  scale = scales.with_multiplier(scales.SCALES["cpu"], multiplier)
  overrides = {"sparsity.structure": structure}
  c = scales.build_config("resnet20,admm", overrides, scale, 0)
  p = scales.build_config("resnet20,admm", overrides, scales.SCALES["paper"],
                          0)
  assert c.sparsity.rho == pytest.approx(p.sparsity.rho * multiplier)
  assert c.sparsity.percent == p.sparsity.percent
  assert c.training.weight_decay == pytest.approx(5e-4 * multiplier)


def test_dry_run_of_the_paper_scale_lists_every_command(tmp_path, capsys):
  proc = _reproduce_here(["all", "--scale=paper", "--dry-run"], tmp_path,
                         capsys)
  out = proc.stdout
  for table in tables.TABLES.values():
    for run in plan_lib.plan(table, scales.SCALES["paper"],
                             root=str(tmp_path / "w")):
      assert run.train_command in out
      assert run.eval_command in out
      for e in run.extra_evals:
        assert e.command in out
  # the paper's protocol is default.py itself: only the evaluation and the
  # row's own settings change
  t1 = plan_lib.plan(tables.TABLES["table1"], scales.SCALES["paper"],
                     root="w")[0]
  assert "num_epochs" not in t1.train_command
  assert "--config.eval.attacks=natural,fgsm,ifgsm20,cw" in t1.train_command
  assert not list(tmp_path.glob("w/*")), "a dry run must not create workdirs"


def test_a_row_named_twice_runs_once(tmp_path, capsys):
  out = _reproduce_here(["table1", "--scale=paper", "--dry-run", "--seeds=1",
                         "--rows=resnet20_none,resnet20_none"], tmp_path,
                        capsys).stdout
  runs = [l for l in out.splitlines() if l.startswith("- ")]
  assert len(runs) == 1 and runs[0].startswith("- resnet20_none seed 0:")


def test_all_runs_a_named_row_in_each_table_that_has_it(tmp_path, capsys):
  out = _reproduce_here(["all", "--scale=paper", "--dry-run", "--seeds=1",
                         "--rows=resnet38_none,en5resnet20_none"], tmp_path,
                        capsys).stdout
  tables_listed = [l.split(":")[0][2:] for l in out.splitlines()
                   if l.startswith("# ") and not l.startswith("# total")]
  has = {n for n, t in tables.TABLES.items()
         if {"resnet38_none", "en5resnet20_none"} & {r.name for r in t.rows}}
  assert set(tables_listed) == has and len(has) >= 2
  runs = {l.split(":")[0] for l in out.splitlines() if l.startswith("- ")}
  assert runs <= {"- resnet38_none seed 0", "- en5resnet20_none seed 0"}
  assert runs


def test_the_runner_imports_every_module_it_uses_at_its_start():
  # A row runs for an hour; a module first imported when it ends would be
  # read from a checkout edited meanwhile, next to old ones in memory.
  code = ("import sys, reproduce.__main__; print(' '.join(sorted("
          "m for m in sys.modules if m.startswith('reproduce.'))))")
  loaded = subprocess.run([sys.executable, "-c", code], check=True,
                          cwd=REPO, capture_output=True,
                          text=True).stdout.split()
  for name in ("report.claims", "report.figures", "report.report",
               "run.execute", "run.plan", "run.records", "run.standing",
               "run.sweeps", "run.estimate", "spec.tables"):
    assert f"reproduce.{name}" in loaded


# --------------------------------------------------------------------------
# The runner end to end (tiny scale).

# One row, shared with Table 1: it is trained in table1's workdir.
ROW = "resnet20_skip"
ROW_WORKDIR = ("tiny", "table1", "resnet20_none_seed0")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  root = tmp_path_factory.mktemp("reproduce")
  cache = root / "cache"
  first = _reproduce(["table5", "--scale=tiny", f"--rows={ROW}"], root,
                     cache)
  return {"root": root, "cache": cache, "first": first}


def _table(root, name="table5"):
  return json.loads((root / "results" / "tiny" / f"{name}.json").read_text())


def test_runner_writes_the_table_with_the_papers_columns(tiny):
  data = _table(tiny["root"])
  # every row is listed; only the one asked for has run
  assert [r["name"] for r in data["rows"]] == [
      r.name for r in tables.TABLES["table5"].rows]
  row = data["rows"][0]
  assert row["name"] == ROW
  assert all(e["status"] == "not started" for r in data["rows"][1:]
             for e in r["runs"])
  assert [e["status"] for e in row["runs"]] == ["done"]
  run = row["runs"][0]
  assert set(run["metrics"]) >= {"A1", "A2"}
  assert 0 <= run["metrics"]["A1"] <= 100
  assert run["wall_seconds"] > 0
  assert run["commands"]["train"].startswith(
      "python train.py --config=configs/default.py:resnet20,none ")
  assert run["commands"]["eval"].startswith("python eval.py ")
  assert row["summary"]["A1"] == {"mean": run["metrics"]["A1"], "std": 0.0,
                                  "n": 1}
  # written when the run finished, not again for nothing after it
  assert tiny["first"].stdout.count("table written") == 1
  assert row["paper"]["A1"] == 76.07
  # a shared row is trained in its owner's workdir
  assert run["workdir"].endswith(os.path.join(*ROW_WORKDIR))
  md = (tiny["root"] / "results" / "tiny" / "table5.md").read_text()
  assert "| A1 natural | paper |" in md
  assert f"| {run['metrics']['A1']:.2f} | 76.07 |" in md
  assert "without skip connections | not yet run | 75.45 |" in md
  assert run["commands"]["train"] in md
  # the record names the machine, and the table says where each run ran
  assert re.fullmatch(r"\d+ x .+ \((cpu|gpu|tpu)\), jax [\d.]+(; .+, \d+ cores?"
                      r"(, (AVX-512|AVX2|no AVX2))?)?",
                      run["devices"]), run["devices"]
  # which test images each attack left right, as the accuracies say
  for column in ("A1", "A2"):
    right = workdir_lib.decode_correct(run["correct_per_image"][column],
                                       run["test_images"])
    assert 100.0 * right.mean() == pytest.approx(run["metrics"][column])
  wall = estimate_lib.format_seconds(run["wall_seconds"])
  assert f"done, {wall} on {run['devices']}" in md
  # the epoch whose checkpoint the numbers are of
  assert 1 <= run["checkpoint_epoch"] <= run["epochs"]
  assert (f"checkpoint of epoch {run['checkpoint_epoch']}/{run['epochs']}"
          in md)
  # the overview beside the tables lists the row (at Table 5: Table 1,
  # which trains it, is not written yet)
  summary = (tiny["root"] / "results" / "tiny" / "overview.md").read_text()
  assert (f"| Table 5: ResNet20, base net | {run['metrics']['A1']:.2f} "
          "(76.07) |" in summary)


def test_the_checkpoint_epoch_and_the_last_epochs_sparsity(tmp_path):
  row = tables.TABLES["table1"].rows[0]
  config = scales.build_config(row.presets, row.overrides,
                               scales.SCALES["cpu"], seed=0)
  # 45,000 images in batches of 128, the last one smaller: 1,760 steps.
  per_epoch = scales.steps_per_epoch(scales.train_size(config), config)
  assert per_epoch == 352
  workdir = str(tmp_path)
  assert report._checkpoint_epoch({"checkpoint_step": 2 * per_epoch},
                                  config, workdir) == {"checkpoint_epoch": 2,
                                                       "epochs": 5}
  assert report._checkpoint_epoch({"checkpoint_step": 2 * per_epoch + 1},
                                  config, workdir)["checkpoint_epoch"] == 3
  assert report._checkpoint_epoch({}, config, workdir) == {}
  # An early checkpoint of a run that pruned later: the log's last epoch.
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for epoch, pruned in ((1, 0.2), (5, 92.0)):
      f.write(json.dumps({"epoch": epoch, "step": epoch * per_epoch,
                          "weight_sparsity": pruned - 1,
                          "channel_sparsity": pruned}) + "\n")
  early = report._checkpoint_epoch({"checkpoint_step": per_epoch}, config,
                                   workdir)
  assert early == {"checkpoint_epoch": 1, "epochs": 5,
                   "last_epoch_sparsity": 91.0,
                   "last_epoch_channel_sparsity": 92.0}
  assert "last_epoch_sparsity" not in report._checkpoint_epoch(
      {"checkpoint_step": 5 * per_epoch}, config, workdir)


def test_wall_times_name_the_machine_where_not_a_cpu():
  cpu = {"wall_seconds": 60.0}   # a record from before records named it
  cpu_new = {"wall_seconds": 180.0, "devices": "1 x cpu (cpu), jax 0.10.2"}
  gpu = {"wall_seconds": 30.0,
         "devices": "1 x NVIDIA H200 (gpu), jax 0.11.2"}
  assert report._wall_times([cpu, cpu_new]) == "2m00s"
  assert report._wall_times([cpu, gpu]) == "1m00s, 0m30s (NVIDIA H200)"
  # a record that names its CPU's instruction set: apart from the others
  avx2 = {"wall_seconds": 300.0,
          "devices": "1 x cpu (cpu), jax 0.10.2; AMD EPYC, 2 cores, AVX2"}
  assert report._wall_times([cpu, avx2]) == "1m00s, 5m00s (cpu AVX2)"
  assert report.machine_of(avx2) == "cpu AVX2"
  assert report.machine_of(cpu_new) == "cpu"


def test_rerun_skips_finished_rows(tiny):
  workdir = tiny["root"] / "w" / os.path.join(*ROW_WORKDIR)
  before = {p.name: p.stat().st_mtime_ns for p in workdir.iterdir()
            if p.is_file()}
  again = _reproduce(["table5", "--scale=tiny", f"--rows={ROW}"],
                     tiny["root"], tiny["cache"])
  assert "1 done, 0 to run" in again.stdout
  assert ": training in" not in again.stdout
  assert again.stdout.count("table written") == 1
  after = {p.name: p.stat().st_mtime_ns for p in workdir.iterdir()
           if p.is_file()}
  assert before == after


# --------------------------------------------------------------------------
# Published runs: fkjax.pretrained loads what the runner keeps under results/.


def test_the_committed_run_names_are_the_tables():
  # fkjax.pretrained resolves names with this file, not with the tables:
  # the runner rewrites it with every table it writes.
  committed = json.loads((REPO / "results" / weights_file.NAMES_FILE)
                         .read_text())
  assert committed == weights.names()
  assert committed["table5"]["resnet20_skip"] == "table1/resnet20_none"
  assert committed["table1"]["resnet20_none"] == "table1/resnet20_none"


def test_a_name_resolves_through_the_names_file_or_as_written(tmp_path):
  assert pretrained.run_dir("gpu/table5/resnet20_skip/seed1",
                            str(tmp_path)) == str(
      tmp_path / "gpu/runs/table5/resnet20_skip_seed1")
  weights.write_names(str(tmp_path))
  assert pretrained.run_dir("gpu/table5/resnet20_skip/seed1",
                            str(tmp_path)) == str(
      tmp_path / "gpu/runs/table1/resnet20_none_seed1")
  with pytest.raises(pretrained.PretrainedError, match="no table 'table9'"):
    pretrained.run_dir("gpu/table9/resnet20_skip/seed1", str(tmp_path))


def test_the_runner_writes_the_run_names_with_its_tables(tiny):
  written = json.loads((tiny["root"] / "results" / weights_file.NAMES_FILE)
                       .read_text())
  assert written == weights.names()


@pytest.mark.slow   # eval.py evaluates the published weights in a process
def test_a_published_run_loads_by_name_and_evaluates_without_training(
    tiny, tmp_path):
  from fkjax import checkpoint as ckpt_lib  # pylint: disable=C0415
  from fkjax.training import build  # pylint: disable=C0415
  from fkjax.training import sparsify  # pylint: disable=C0415
  import jax  # pylint: disable=C0415
  results = str(tiny["root"] / "results")
  kept = tiny["root"] / "results" / "tiny" / "runs" / os.path.join(
      *ROW_WORKDIR[1:])
  assert pretrained.available(results) == ["tiny/table1/resnet20_none/seed0"]
  # Table 5's row is Table 1's run, loaded by either name
  model, variables, config, record = pretrained.load(
      "tiny/table5/resnet20_skip/seed0", results)
  assert record["metrics"] == json.loads(
      (kept / archive_lib.RUN_RECORD).read_text())["metrics"]
  workdir = str(tiny["root"] / "w" / os.path.join(*ROW_WORKDIR))
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = build.Experiment.build(config)
    _, state = exp.restore(checkpointer, config.eval.checkpoint)
  evaluated = sparsify.eval_variables(state, config)
  for a, b in zip(jax.tree.leaves(evaluated), jax.tree.leaves(variables)):
    np.testing.assert_array_equal(np.asarray(a), b)
  images = np.zeros((2, 32, 32, 3), np.float32)
  logits = model.apply(variables, images, train=False,
                       rngs={"noise": jax.random.PRNGKey(0)})
  assert logits.shape == (2, 10)
  # written into a workdir, eval.py evaluates it to the run's numbers
  target = tmp_path / "published"
  # `python -m fkjax.pretrained NAME --workdir=...`'s main, in this process
  assert pretrained.main(["tiny/table1/resnet20_none/seed0",
                          f"--workdir={target}",
                          f"--results={results}"]) == 0
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={target}",
       "--config.progress=False"], cwd=REPO, capture_output=True, text=True,
      timeout=TIMEOUT_S, env=_env(tiny["cache"]))
  assert proc.returncode == 0, proc.stderr
  got = json.loads((target / "eval_paper.json").read_text())
  want = json.loads((kept / "eval_paper.json").read_text())
  assert got["correct_per_image"] == want["correct_per_image"]


def test_unknown_or_unpublished_names_are_one_clear_error(tiny):
  results = str(tiny["root"] / "results")
  with pytest.raises(pretrained.PretrainedError, match="is not <scale>"):
    pretrained.load("table1/resnet20_none", results)
  with pytest.raises(pretrained.PretrainedError, match="no published"):
    pretrained.load("tiny/table1/en2resnet20_none/seed0", results)
  with pytest.raises(pretrained.PretrainedError, match="has no row"):
    pretrained.load("tiny/table1/resnet99/seed0", results)


def _tree_digest(folder):
  h = hashlib.sha256()
  for path in sorted(Path(folder).rglob("*")):
    h.update(str(path.relative_to(folder)).encode())
    if path.is_file():
      h.update(path.read_bytes())
  return h.hexdigest()


def test_a_dry_run_writes_nothing(tiny, tmp_path, capsys):
  results = tiny["root"] / "results"
  before = _tree_digest(results)
  root = tmp_path / "w"
  capsys.readouterr()
  assert reproduce_main.main(
      ["table5", "--scale=tiny", f"--rows={ROW}", "--dry-run",
       f"--root={root}", f"--results={results}"]) == 0
  assert "resnet20_skip seed 0 (shared: table1/resnet20_none): done" in (
      capsys.readouterr().out)
  assert not root.exists()
  assert _tree_digest(results) == before


@pytest.mark.slow   # a row killed and resumed in subprocesses, end to end
def test_killed_row_resumes_to_the_uninterrupted_result(tiny):
  """SIGKILL mid-row, rerun: the same numbers as the run never killed."""
  root = tiny["root"] / "killed"
  args = ["table5", "--scale=tiny", f"--rows={ROW}"]
  proc = subprocess.Popen(
      [sys.executable, "-m", "reproduce", *args, f"--root={root / 'w'}",
       f"--results={root / 'results'}"], cwd=REPO, env=_env(tiny["cache"]),
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  workdir = root / "w" / os.path.join(*ROW_WORKDIR)
  first_epoch = workdir / "checkpoints" / "4"
  deadline = time.time() + TIMEOUT_S
  while not first_epoch.exists() and proc.poll() is None:
    assert time.time() < deadline, f"no checkpoint after {TIMEOUT_S} s"
    time.sleep(0.02)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (workdir / archive_lib.RUN_RECORD).exists(), "killed too late"
  progress = json.loads((workdir / archive_lib.PROGRESS_FILE).read_text())
  assert not progress["stages"]["train"]["done"]

  rerun = _reproduce(args, root, tiny["cache"])
  assert "resumed from step" in rerun.stdout
  record = json.loads((workdir / archive_lib.RUN_RECORD).read_text())
  assert record["stage_attempts"]["train"] == 2
  reference_dir = tiny["root"] / "w" / os.path.join(*ROW_WORKDIR)
  reference = json.loads((reference_dir / archive_lib.RUN_RECORD).read_text())
  assert record["metrics"] == reference["metrics"]
  for name in ("eval_paper.json", "analysis.json"):
    got = json.loads((workdir / name).read_text())
    want = json.loads((reference_dir / name).read_text())
    if name == "eval_paper.json":
      got, want = ({k: v["correct"] for k, v in d["attacks"].items()}
                   for d in (got, want))
    assert got == want, name


def _write_cifar100(folder):
  """A CIFAR-100 binary release of random images at the official sizes."""
  rng = np.random.default_rng(0)
  folder.mkdir(parents=True)
  for name, n in (("train.bin", 50000), ("test.bin", 10000)):
    records = rng.integers(0, 256, size=(n, 3074), dtype=np.uint8)
    fine = np.arange(n) % 100
    records[:, 0] = fine // 5     # coarse label
    records[:, 1] = fine
    records.tofile(folder / name)


@pytest.mark.slow   # Table 7 end to end on a CIFAR-100 release the test writes
def test_table7_runs_on_a_cifar100_release(tiny):
  data_dir = tiny["root"] / "data"
  _write_cifar100(data_dir / "cifar-100-binary")
  _reproduce(["table7", "--scale=tiny", "--rows=resnet20_none",
              f"--data_dir={data_dir}"], tiny["root"], tiny["cache"])
  data = _table(tiny["root"], "table7")
  run = data["rows"][0]["runs"][0]
  assert run["status"] == "done", run
  assert "CIFAR-100" in run["data"] and "cifar_binary" in run["data"]
  assert f"--config.dataset.data_dir={data_dir}" in run["commands"]["train"]
  assert data["rows"][0]["paper"]["A1"] == 46.02


def _fake_run_files(run, rng):
  """The files a finished run leaves, with made-up weights."""
  from reproduce import analysis  # pylint: disable=C0415
  os.makedirs(run.workdir)
  w = {"conv": {"kernel": rng.normal(0, 0.05, (3, 3, 64, 64))},
       "stem": {"kernel": rng.normal(0, 0.1, (3, 3, 3, 16))}}
  u = {"conv": {"kernel": np.where(np.abs(w["conv"]["kernel"]) < 0.02, 0.0,
                                   w["conv"]["kernel"])},
       "stem": w["stem"]}
  summary, arrays = analysis.analyze_params(w, u)
  np.savez(os.path.join(run.workdir, "analysis.npz"), **arrays)
  for name, data in (("analysis.json", summary),
                     (archive_lib.RUN_RECORD, {"done": True})):
    Path(run.workdir, name).write_text(json.dumps(data))
  return summary


@pytest.mark.parametrize("table", ["sec3", "table4"])
def test_figures_are_drawn_from_the_runs_files(tmp_path, table):
  from reproduce.report import figures  # pylint: disable=C0415
  rng = np.random.default_rng(0)
  runs = plan_lib.plan(tables.TABLES[table], scales.SCALES["tiny"],
                       root=str(tmp_path))
  summary = [_fake_run_files(run, rng) for run in runs][0]
  # 1e-3 of a N(0, 0.05) kernel: about 1.6% of its weights
  assert 1.0 < summary["w"]["small_share"] < 2.5
  assert summary["u"]["zero_share"] > summary["w"]["zero_share"] == 0.0
  assert summary["figure_layer"] == "conv/kernel"
  for kind in tables.TABLES[table].figures:
    if kind == "training":   # from the training logs, tested below
      continue
    path = tmp_path / f"{kind}.png"
    assert figures.draw(kind, runs, {}, str(path)) == str(path)
    assert path.stat().st_size > 1000


def test_training_figure_marks_each_seeds_evaluated_checkpoint(tmp_path):
  from reproduce.report import figures  # pylint: disable=C0415
  table = tables.TABLES["table2"]
  runs = plan_lib.plan(table, scales.SCALES["tiny"], root=str(tmp_path),
                       seeds=2)
  for run in runs:
    os.makedirs(run.workdir)
    with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
      for epoch in (1, 2, 3):
        f.write(json.dumps({
            "epoch": epoch, "step": 10 * epoch,
            "val_natural_accuracy": 30.0 + 10 * epoch + run.seed,
            "weight_sparsity": 5.0 * epoch,
            "channel_sparsity": 20.0 * epoch}) + "\n")
  # the RGSM row at lambda1 0.05 finished both seeds (seed 1 kept its
  # epoch-1 checkpoint); at 0.1 only seed 0; the unpruned row is left out
  # as is every unfinished run
  rgsm = "resnet20_rgsm_l0.05"
  data = {"rows": [
      {"name": "resnet20_none", "label": {"Net": "ResNet20"},
       "runs": [{"seed": 0, "status": "done", "checkpoint_epoch": 3}]},
      {"name": rgsm, "label": {"Net": "ResNet20", "beta": "1",
                               "lambda1": "0.05", "lambda2": "n/a"},
       "runs": [{"seed": 0, "status": "done", "checkpoint_epoch": 3},
                {"seed": 1, "status": "done", "checkpoint_epoch": 1}]},
      {"name": "resnet20_rgsm_l0.1", "label": {"Net": "ResNet20"},
       "runs": [{"seed": 0, "status": "done", "checkpoint_epoch": 2},
                {"seed": 1, "status": "trained 2/5 epochs"}]}]}
  fig = figures.training_figure(runs, data)
  shown = [ax for ax in fig.axes if ax.axison]
  assert len(shown) == 4   # two rows, accuracy above sparsity
  top, bottom = shown[0], shown[2]
  assert top.get_title() == "ResNet20\nbeta 1, lambda1 0.05"
  assert bottom.get_ylabel() == "channels pruned (%)"
  # the filled markers: each seed's evaluated epoch, on both panels
  def filled(ax):
    return sorted((float(line.get_xdata()[0]), float(line.get_ydata()[0]))
                  for line in ax.lines if line.get_markerfacecolor() != "none")
  assert filled(top) == [(1.0, 41.0), (3.0, 60.0)]
  assert filled(bottom) == [(1.0, 20.0), (3.0, 60.0)]
  assert len(shown[1].get_legend().get_texts()) == 1   # lambda1 0.1: seed 0
  path = tmp_path / "training.png"
  assert figures.draw("training", runs, data, str(path)) == str(path)
  assert figures.draw("training", runs, {"rows": []}, str(path)) is None


def test_lambda_sweep_figure(tmp_path):
  from reproduce.report import figures  # pylint: disable=C0415
  data = {"metrics": tables.METRICS, "rows": [
      {"label": {"Net": net}, "overrides": {"sparsity.lamb1": lamb},
       "summary": {m: {"mean": 50.0 + lamb, "std": 1.0, "n": 3}
                   for m in ("A1", "A2", "A3", "A4", "channel_sparsity")}}
      for net in ("En2ResNet20", "ResNet38") for lamb in (0.05, 0.1)]}
  data["rows"][1]["paper"] = {"channel_sparsity": 56.74, "A1": 76.3}
  # Two seeds whose checkpoints are of different epochs, one not done.
  data["rows"][1]["runs"] = [
      {"status": "done", "checkpoint_epoch": 1,
       "metrics": {"channel_sparsity": 0.22, "A1": 36.6}},
      {"status": "done", "checkpoint_epoch": 5,
       "metrics": {"channel_sparsity": 91.7, "A1": 37.6}},
      {"status": "training", "metrics": {"A1": 99.0}}]
  path = tmp_path / "sweep.png"
  assert figures.lambda_sweep(data, str(path)) == str(path)
  assert figures.lambda_sweep({"metrics": {}, "rows": []},
                              str(tmp_path / "none.png")) is None
  # The paper's channel sparsity beside fkjax's, in its panel only.
  fig = figures._sweep_figure(data, "sparsity.lamb1", "lambda1",  # pylint: disable=W0212
                              "channel_sparsity")
  sparsity, natural = fig.axes[0], fig.axes[1]
  assert sparsity.get_legend_handles_labels()[1] == [
      "En2ResNet20", "En2ResNet20, paper", "ResNet38"]
  paper_line = next(l for l in sparsity.get_lines()
                    if l.get_label() == "En2ResNet20, paper")
  assert list(paper_line.get_xdata()) == [0.1]
  assert list(paper_line.get_ydata()) == [56.74]
  assert "paper" not in " ".join(natural.get_legend_handles_labels()[1])
  # Each done seed's value is drawn beside the mean, in every panel.
  def seed_dots(ax):
    return sorted(tuple(map(float, xy)) for c in ax.collections
                  for xy in c.get_offsets())
  assert seed_dots(sparsity) == [(0.1, 0.22), (0.1, 91.7)]
  assert seed_dots(natural) == [(0.1, 36.6), (0.1, 37.6)]
  low, high = natural.get_ylim()   # the dots are inside the axes
  assert low < 36.6 and high > 50.0 + 0.1
  assert "ep 1,5" in [t.get_text() for t in sparsity.texts]


def test_beta_sweep_figure(tmp_path):
  # Table 1's rows against beta; the unpruned rows (no beta) are left out.
  from reproduce.report import figures  # pylint: disable=C0415
  rows = [{"label": {"Net": net}, "overrides": overrides,
           "paper": {"sparsity": 80.91} if overrides else {},
           "summary": {m: {"mean": 40.0, "std": 1.0, "n": 3}
                       for m in ("A1", "A2", "A3", "A4", "sparsity")}}
          for net in ("En2ResNet20", "ResNet20")
          for overrides in ({}, {"sparsity.beta": 0.01},
                            {"sparsity.beta": 0.5})]
  data = {"metrics": tables.METRICS, "rows": rows}
  path = tmp_path / "beta.png"
  assert figures.draw("beta_sweep", [], data, str(path)) == str(path)
  assert path.stat().st_size > 1000
  fig = figures._sweep_figure(data, "sparsity.beta", "beta",  # pylint: disable=W0212
                              "sparsity", log_x=True)
  sparsity = fig.axes[0]
  assert sparsity.get_xscale() == "log"
  assert sorted(sparsity.get_legend_handles_labels()[1]) == [
      "En2ResNet20", "En2ResNet20, paper", "ResNet20", "ResNet20, paper"]
  assert {float(x) for l in sparsity.get_lines()
          for x in l.get_xdata()} == {0.01, 0.5}
  assert "beta_sweep" in tables.TABLES["table1"].figures



def test_a_placeholder_added_after_a_run_keeps_it_done(tmp_path):
  # A run trained before fkjax gained an (unset) config key stays done; once
  # the key is set, or for a run that was saved with it, it counts.
  import dataclasses  # pylint: disable=import-outside-toplevel
  from ml_collections import config_dict  # pylint: disable=import-outside-toplevel
  run = plan_lib.plan(tables.TABLES["table5"], scales.SCALES["tiny"],
                      rows=[ROW], seeds=1, root=str(tmp_path))[0]
  os.makedirs(run.workdir)
  run_config.save(run.config, run.workdir)
  before = standing_lib.fingerprints(run)
  config = run.config.copy_and_resolve_references()
  with config.unlocked():
    config.training.added_later = config_dict.placeholder(int)
  newer = dataclasses.replace(run, config=config)
  assert standing_lib.fingerprints(newer) == before
  config.training.added_later = 3
  assert standing_lib.fingerprints(newer)["train"] != before["train"]
  config.training.added_later = None
  run_config.save(config, run.workdir)
  assert standing_lib.fingerprints(newer)["train"] != before["train"]


def test_admm_rows_report_the_accuracy_of_the_dense_w(tmp_path):
  # eval.py writes the dense w's accuracies of an ADMM run beside those of
  # its projection; Table 4 shows both (the paper evaluated w).
  (tmp_path / "eval_paper.json").write_text(json.dumps({
      "attacks": {"natural": {"accuracy": 15.0}, "fgsm": {"accuracy": 12.0}},
      "weight_sparsity": 80.0, "channel_sparsity": 1.0,
      "admm_dense_w": {"attacks": {"natural": {"accuracy": 27.0},
                                   "fgsm": {"accuracy": 18.0}}}}))
  metrics = records_lib.metrics_of(str(tmp_path), "eval_paper.json")
  assert (metrics["A1"], metrics["A2"]) == (15.0, 12.0)
  assert (metrics["w_A1"], metrics["w_A2"]) == (27.0, 18.0)
  assert "w_A3" not in metrics
  assert {"w_A1", "w_A2", "w_A3"} <= set(tables.TABLES["table4"].metrics)


# --------------------------------------------------------------------------
# Finished runs kept under results/ (reproduce.run.archive).


def test_finished_runs_are_kept_under_results_without_checkpoints(tiny):
  from reproduce.run import archive  # pylint: disable=C0415
  kept = tiny["root"] / "results" / "tiny" / "runs" / os.path.join(
      *ROW_WORKDIR[1:])
  names = {p.name for p in kept.iterdir()}
  assert {archive_lib.RUN_RECORD, "config.json", "metrics.jsonl",
          "eval_paper.json", "analysis.json", "analysis.npz"} <= names
  assert all(p.is_file() for p in kept.iterdir())   # no checkpoint folders
  record = json.loads((kept / archive_lib.RUN_RECORD).read_text())
  workdir = tiny["root"] / "w" / os.path.join(*ROW_WORKDIR)
  assert record == json.loads((workdir / archive_lib.RUN_RECORD).read_text())
  assert kept == Path(archive.archive_dir(str(tiny["root"] / "results"),
                                          "tiny", "table1", "resnet20_none",
                                          0))


@pytest.mark.slow
def test_a_checkout_without_workdirs_restores_finished_runs(tiny, tmp_path):
  # A fresh clone has results/ but no workdirs: the runner must report the
  # finished run as before, and train nothing.
  shutil.copytree(tiny["root"] / "results", tmp_path / "results")
  again = _reproduce(["table5", "--scale=tiny", f"--rows={ROW}"], tmp_path,
                     tiny["cache"])
  assert "restored the finished run" in again.stdout
  assert "1 done, 0 to run" in again.stdout
  assert ": training in" not in again.stdout
  before, after = _table(tiny["root"]), _table(tmp_path)
  assert before["rows"][0]["runs"][0]["metrics"] == (
      after["rows"][0]["runs"][0]["metrics"])
  assert (tmp_path / "w" / os.path.join(*ROW_WORKDIR) / "analysis.npz"
          ).exists()


def test_an_archive_is_rewritten_when_its_runs_files_change(tmp_path):
  # e.g. a finished run evaluated again: its archive must follow
  work, kept = tmp_path / "w", tmp_path / "kept"
  work.mkdir()
  (work / archive_lib.RUN_RECORD).write_text('{"done": true}')
  (work / "eval_paper.json").write_text('{"attacks": {}}')
  (work / "checkpoints").mkdir()
  assert archive_lib.differs(str(work), str(kept))
  archive_lib.save(str(work), str(kept))
  assert not archive_lib.differs(str(work), str(kept))
  (kept / "eval_old.json").write_text("{}")   # kept only: no difference
  assert not archive_lib.differs(str(work), str(kept))
  (work / "eval_paper.json").write_text('{"attacks": {}, "more": 1}')
  assert archive_lib.differs(str(work), str(kept))


def test_a_kept_run_of_other_settings_is_not_restored(tmp_path):
  # A run kept in results/ whose training settings are not the table's any
  # more (a changed default) trains again: its files are not restored.
  run = plan_lib.plan(tables.TABLES["table5"], scales.SCALES["tiny"],
                      rows=[ROW], seeds=1, root=str(tmp_path / "w"))[0]
  archive = archive_lib.archive_dir(str(tmp_path / "results"), "tiny",
                                    run.owner_table, run.owner_row.name, 0)
  os.makedirs(archive)
  kept = json.dumps({"metrics": {"A1": 41.0}, "done": True,
                     "fingerprints": {"train": "0" * 16, "eval": "0" * 16}})
  Path(archive, archive_lib.RUN_RECORD).write_text(kept)
  run = plan_lib.plan(tables.TABLES["table5"], scales.SCALES["tiny"],
                      rows=[ROW], seeds=1, root=str(tmp_path / "w"),
                      results=str(tmp_path / "results"))[0]
  assert standing_lib.status_of(run) == "not started"
  assert not os.path.exists(run.workdir)
  # what is kept stays as it was until the run finishes again
  assert Path(archive, archive_lib.RUN_RECORD).read_text() == kept


@pytest.mark.slow
def test_an_evaluation_added_to_a_finished_run_runs_alone(tiny, tmp_path,
                                                          capsys):
  # Table 1 adds the strong column to the row the fixture trained for
  # Table 5: only that evaluation runs. A checkout restored from results/
  # has no checkpoint to run it on: the row is reported without it.
  shutil.copytree(tiny["root"] / "results", tmp_path / "results")
  args = ["table1", "--scale=tiny", "--rows=resnet20_none"]
  dry = _reproduce_here([*args, "--dry-run"], tiny["root"], capsys)
  assert "resnet20_none seed 0: done, eval_strong not yet run" in dry.stdout
  out = _reproduce(args, tiny["root"], tiny["cache"])
  assert ": training in" not in out.stdout
  assert "extra evaluation strong" in out.stdout
  run = _table(tiny["root"], "table1")["rows"][0]["runs"][0]
  assert run["pending"] == []
  assert 0 <= run["metrics"]["A_strong"] <= run["metrics"]["A1"]
  strong = json.loads((tiny["root"] / "w" / os.path.join(*ROW_WORKDIR)
                       / "eval_strong.json").read_text())
  assert strong["settings"]["eot_samples"] == 1   # a deterministic net
  assert run["metrics"]["A_strong"] == strong["worst_case"]["accuracy"]

  restored = _reproduce(args, tmp_path, tiny["cache"])
  assert "no checkpoint to evaluate" in restored.stdout
  assert "extra evaluation" not in restored.stdout
  run = _table(tmp_path, "table1")["rows"][0]["runs"][0]
  assert (run["status"], run["pending"]) == ("done", ["eval_strong"])
  assert "A_strong" not in run["metrics"] and "A1" in run["metrics"]
  md = (tmp_path / "results" / "tiny" / "table1.md").read_text()
  assert "done (eval_strong not yet run)" in md


def test_a_shared_run_with_another_tables_evaluation_is_done(tmp_path):
  # Table 2 adds A5 to the runs it shares with Tables 1, 4 and 5: that
  # extra evaluation's fingerprint in the record must not mark the run as
  # changed for the tables that do not ask for it.
  run = plan_lib.plan(tables.TABLES["table5"], scales.SCALES["tiny"],
                      rows=[ROW], seeds=1, root=str(tmp_path))[0]
  os.makedirs(run.workdir)
  run_config.save(run.config, run.workdir)
  record = {"done": True,
            "fingerprints": {**standing_lib.fingerprints(run), "eval_a5": "x"}}
  Path(run.workdir, archive_lib.RUN_RECORD).write_text(json.dumps(record))
  assert standing_lib.status_of(run) == "done"
  # Another main evaluation: it runs again, the training stays.
  record["fingerprints"]["eval"] = "changed"
  Path(run.workdir, archive_lib.RUN_RECORD).write_text(json.dumps(record))
  assert standing_lib.status_of(run) == "done, eval not yet run"
  assert standing_lib.finished(run)
  assert standing_lib.evals_to_run(run) == ["eval"]
  record["fingerprints"]["train"] = "changed"
  Path(run.workdir, archive_lib.RUN_RECORD).write_text(json.dumps(record))
  assert standing_lib.status_of(run).startswith("to update")


@pytest.mark.slow   # the row trained again in a subprocess, end to end
def test_no_restore_trains_a_kept_run_again_to_the_same_numbers(tiny,
                                                                 tmp_path):
  shutil.copytree(tiny["root"] / "results", tmp_path / "results")
  out = _reproduce(["table5", "--scale=tiny", f"--rows={ROW}",
                    "--no-restore"], tmp_path, tiny["cache"])
  assert "restored" not in out.stdout
  assert "training" in out.stdout
  workdir = tmp_path / "w" / os.path.join(*ROW_WORKDIR)
  assert (workdir / "checkpoints").is_dir()
  # the same code, data and seed: the same numbers as the kept run
  again = _table(tmp_path)["rows"][0]["runs"][0]["metrics"]
  kept = _table(tiny["root"])["rows"][0]["runs"][0]["metrics"]
  assert {k: again[k] for k in ("A1", "A2")} == {k: kept[k]
                                                 for k in ("A1", "A2")}


def test_analysis_of_an_ensemble_reads_its_member_stacked_kernels():
  from reproduce import analysis  # pylint: disable=C0415
  rng = np.random.default_rng(0)
  stacked = rng.normal(0, 0.05, (2, 3, 3, 64, 64))
  stacked[1, :, :, 5, :] = 0.0   # one input channel of member 1 pruned
  w = {"members": {"conv": {"kernel": stacked}}}
  summary, arrays = analysis.analyze_params(w, w, layout="MHWIO")
  assert summary["w"]["num_weights"] == stacked.size
  assert summary["w"]["num_channels"] == 2 * 64
  assert summary["w"]["channel_sparsity"] == pytest.approx(100 / 128)
  # the block the figures draw: member 0's first 16 inputs and filters
  np.testing.assert_array_equal(arrays["figure_layer_kernel"],
                                stacked[0, :, :, :16, :16].astype(np.float32))


@pytest.mark.slow   # an En2 row through every stage, end to end
def test_an_ensemble_row_runs_every_stage(tiny, tmp_path, capsys):
  # En2ResNet20 under RGSM with Table 2's extra columns: NAttack (A5) and
  # the strong protocol with EOT over the noise; the analysis reads the
  # member-stacked kernels.
  # --defer-extra-evals first: the run is reported without A5 and the
  # strong column; the command without it then runs those two alone.
  row = "en2resnet20_rgsm_l0.05"
  args = ["table2", "--scale=tiny", f"--rows={row}"]
  deferred = _reproduce([*args, "--defer-extra-evals"], tmp_path,
                        tiny["cache"])
  assert "extra evaluation" not in deferred.stdout
  run = next(r for r in _table(tmp_path, "table2")["rows"]
             if r["name"] == row)["runs"][0]
  assert (run["status"], run["pending"]) == ("done",
                                             ["eval_a5", "eval_strong"])
  assert "A1" in run["metrics"] and "channel_sparsity" in run["metrics"]
  assert not {"A5", "A_strong"} & set(run["metrics"])
  again = _reproduce_here([*args, "--defer-extra-evals", "--dry-run"],
                          tmp_path, capsys)
  assert "(deferred), ~0m00s" in again.stdout
  out = _reproduce(args, tmp_path, tiny["cache"])
  assert ": training in" not in out.stdout
  assert "extra evaluation a5" in out.stdout
  assert "extra evaluation strong" in out.stdout
  data = _table(tmp_path, "table2")
  run = next(r for r in data["rows"] if r["name"] == row)["runs"][0]
  assert run["status"] == "done" and run["pending"] == []
  assert {"A1", "A2", "A5", "A_strong", "channel_sparsity"} <= set(
      run["metrics"])
  workdir = tmp_path / "w" / "tiny" / "table2" / f"{row}_seed0"
  strong = json.loads((workdir / "eval_strong.json").read_text())
  assert strong["settings"]["eot_samples"] == 2   # noisy: the row's EOT
  stats = json.loads((workdir / "analysis.json").read_text())
  assert stats["figure_layer"].startswith("members/")
  assert stats["w"]["num_channels"] > 0


@pytest.mark.slow
def test_a_run_stopped_in_its_last_extra_evaluation_keeps_the_first(
    tiny, tmp_path, monkeypatch, capsys):
  # Table 2 adds A5 and the strong column to the fixture's ResNet20 run; the
  # strong evaluation (the last) stops as a killed session would: the
  # record, its copy under results/ and the table keep A5, and the strong
  # column stays pending.
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  shutil.copytree(tiny["root"] / "w", tmp_path / "w")
  workdir = tmp_path / "w" / os.path.join(*ROW_WORKDIR)
  # Another test may have run Table 1's strong column here already.
  progress = json.loads((workdir / archive_lib.PROGRESS_FILE).read_text())
  progress["stages"].pop("eval_strong", None)
  (workdir / archive_lib.PROGRESS_FILE).write_text(json.dumps(progress))
  (workdir / "eval_strong.json").unlink(missing_ok=True)

  evaluate = eval_run.evaluate_checkpoint

  def stopped_in_strong(config, directory, **kwargs):
    if config.eval.get("protocol") == "strong":
      raise RuntimeError("stopped")
    return evaluate(config, directory, **kwargs)

  monkeypatch.setattr(eval_run, "evaluate_checkpoint", stopped_in_strong)
  run = plan_lib.plan(tables.TABLES["table2"], scales.SCALES["tiny"],
                      rows=["resnet20_none"], seeds=1,
                      root=str(tmp_path / "w"),
                      results=str(tmp_path / "results"))[0]
  assert Path(run.workdir) == workdir
  with pytest.raises(RuntimeError, match="stopped"):
    execute_lib.execute(run, show_progress=False)
  assert standing_lib.status_of(run) == "done, eval_strong not yet run"
  kept = json.loads(Path(run.archive, archive_lib.RUN_RECORD).read_text())
  assert "eval_a5" in kept["fingerprints"]
  assert "eval_strong" not in kept["fingerprints"]
  assert 0 <= kept["metrics"]["A5"] <= kept["metrics"]["A1"]
  assert "A_strong" not in kept["metrics"]

  _reproduce_here(["table2", "--scale=tiny", "--rows=resnet20_none",
                   "--report-only"], tmp_path, capsys)
  reported = next(r for r in _table(tmp_path, "table2")["rows"]
                  if r["name"] == "resnet20_none")["runs"][0]
  assert reported["pending"] == ["eval_strong"]
  assert reported["metrics"]["A5"] == kept["metrics"]["A5"]


def test_the_cpu_scale_checkpoints_within_an_epoch_without_changing_runs(
    tmp_path):
  # A run killed mid-epoch (an hour-long ensemble epoch on 2 cores) loses
  # only what followed its last checkpoint; how often it checkpoints is not
  # what it computes, so finished runs stay done.
  import dataclasses  # pylint: disable=import-outside-toplevel
  run = plan_lib.plan(tables.TABLES["table2"], scales.SCALES["cpu"],
                      rows=["en5resnet20_rgsm_l0.02"], seeds=1,
                      root=str(tmp_path))[0]
  every = run.config.training.checkpoint_every_steps
  per_epoch = scales.steps_per_epoch(scales.train_size(run.config),
                                     run.config)
  assert 0 < every <= per_epoch // 4
  assert f"--config.training.checkpoint_every_steps={every}" in (
      run.train_command)
  config = run.config.copy_and_resolve_references()
  config.training.checkpoint_every_steps = 0
  assert standing_lib.fingerprints(dataclasses.replace(run, config=config)) == (
      standing_lib.fingerprints(run))


def test_a_partly_trained_run_is_estimated_by_what_is_left(tmp_path):
  run = plan_lib.plan(tables.TABLES["table1"], scales.SCALES["cpu"],
                      rows=["en2resnet20_rvsm_b0.01"], seeds=1,
                      root=str(tmp_path))[0]
  whole = estimate_lib.estimate_seconds(run)
  assert standing_lib.trained_epochs(run) is None
  os.makedirs(run.workdir)
  with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
    for epoch in (1, 2):
      f.write(json.dumps({"epoch": epoch, "step": 352 * epoch}) + "\n")
  assert standing_lib.trained_epochs(run) == 2
  assert standing_lib.status_of(run) == "trained 2/5 epochs"
  # An evaluation killed after 3 batches says so (fkjax.evaluation.journal).
  journal = eval_journal.Journal(
      os.path.join(run.workdir, eval_journal.JOURNAL_DIR, "eval_paper.json"),
      {})
  journal.save({}, batches_done=3, num_examples=30, correct={}, seconds={},
               compile_seconds={}, predict_compile_seconds=0.0,
               per_image=None)
  assert standing_lib.status_of(run) == ("trained 2/5 epochs, evaluating (3 "
                                         "batches done)")
  journal.remove()
  evaluations = estimate_lib.estimate_seconds(run, epochs_done=5)
  left = estimate_lib.estimate_seconds(run, epochs_done=2)
  assert 0 < evaluations < left < whole
  assert left - evaluations == pytest.approx(0.6 * (whole - evaluations))


def test_estimates_scale_with_the_machines_step_times(tmp_path):
  run = plan_lib.plan(tables.TABLES["table2"], scales.SCALES["cpu"],
                      rows=["en2resnet20_rgsm_l0.05"], seeds=1,
                      root=str(tmp_path))[0]
  assert run.extra_evals   # A5 and the strong column: evaluation-only costs
  reference = estimate_lib.REFERENCE_STEP_TIMES
  twice = estimate_lib.StepTimes(2 * reference.clean_step,
                                 2 * reference.attack_iteration)
  assert estimate_lib.estimate_seconds(run, step_times=twice) == pytest.approx(
      2 * estimate_lib.estimate_seconds(run))
  assert estimate_lib.estimate_seconds(
      run, only=run.extra_evals, step_times=twice) == pytest.approx(
          2 * estimate_lib.estimate_seconds(run, only=run.extra_evals))
  # A slower clean step alone: training and compiling slow down, the
  # evaluations (attack iterations) do not.
  slower_clean = estimate_lib.StepTimes(2 * reference.clean_step,
                                        reference.attack_iteration)
  assert (estimate_lib.estimate_seconds(run, only=run.extra_evals,
                                        step_times=slower_clean)
          == pytest.approx(estimate_lib.estimate_seconds(run,
                                                         only=run.extra_evals)))
  assert (estimate_lib.estimate_seconds(run)
          < estimate_lib.estimate_seconds(run, step_times=slower_clean)
          < estimate_lib.estimate_seconds(run, step_times=twice))


@pytest.mark.slow
def test_calibration_times_a_clean_and_an_attacked_step():
  from reproduce.run import calibrate  # pylint: disable=import-outside-toplevel
  times = calibrate.measure(repeats=1, depth=8, batch_size=8)
  assert 0 < times.clean_step < 60
  assert times.attack_iteration >= 0.25 * times.clean_step
  with pytest.raises(ValueError, match="repeats and attack_steps"):
    calibrate.measure(repeats=0)


def test_calibrate_goes_with_dry_run(tmp_path, capsys):
  proc = _reproduce_here(["table4", "--scale=cpu", "--calibrate"], tmp_path,
                         capsys, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      "error: --calibrate goes with --dry-run (it scales the dry run's "
      "estimates)")


def test_a_calibrated_dry_run_estimates_for_this_machine(tmp_path, capsys,
                                                        monkeypatch):
  # In process, with the timing replaced: calibrate.measure itself is timed
  # for real above (a real ResNet20 calibration costs the suite ~40 s), and
  # the runner's flags must not touch the test process's XLA_FLAGS.
  from fkjax import kernels  # pylint: disable=import-outside-toplevel
  from reproduce import __main__ as cli_main  # pylint: disable=import-outside-toplevel
  from reproduce.run import calibrate  # pylint: disable=import-outside-toplevel
  slower = estimate_lib.StepTimes(clean_step=0.606, attack_iteration=0.2848)
  monkeypatch.setattr(calibrate, "measure", lambda: slower)
  monkeypatch.setattr(kernels, "apply_xla_flags", lambda: None)
  monkeypatch.chdir(REPO)
  assert cli_main.main(["table4", "--scale=cpu", "--dry-run", "--calibrate",
                        "--seeds=1", f"--root={tmp_path / 'w'}",
                        f"--results={tmp_path / 'results'}"]) == 0
  calibrated = capsys.readouterr().out
  assert cli_main.main(["table4", "--scale=cpu", "--dry-run", "--seeds=1",
                        f"--root={tmp_path / 'w'}",
                        f"--results={tmp_path / 'results'}"]) == 0
  reference = capsys.readouterr().out
  header = calibrated.splitlines()[0]
  assert header.startswith(
      "# this machine's ResNet20 steps at batch 128: 0.606 s clean, "
      "+0.285 s per attack iteration"), header
  estimates = re.findall(r"^- .*: not started, ~(\S+) on this machine$",
                         calibrated, re.M)
  assert len(estimates) == len(tables.TABLES["table4"].rows)
  assert "idle CPU cores:" not in calibrated.split("\n", 1)[1]
  # Twice the reference's step times: every run's estimate is longer.
  at_reference = re.findall(r"^- .*: not started, ~(\S+) on 2 idle CPU cores$",
                            reference, re.M)
  assert len(at_reference) == len(estimates)
  assert all(_seconds(c) > _seconds(r)
             for c, r in zip(estimates, at_reference)), (estimates,
                                                          at_reference)


def _seconds(duration: str) -> int:
  """Seconds of a dry run's estimate (``estimate_lib.format_seconds``:
  ``1h02m``, ``12m05s``)."""
  parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
  assert parts and duration, duration
  h, m, s = (int(x or 0) for x in parts.groups())
  return 3600 * h + 60 * m + s


@pytest.mark.slow
def test_a_reader_stopping_early_ends_the_runner_without_a_traceback(
    tmp_path):
  # `... --dry-run | head`: the dry run of every table (>100 KB) overfills
  # the pipe, so the runner is still writing when the reader goes.
  proc = subprocess.Popen(
      [sys.executable, "-m", "reproduce", "all", "--scale=cpu",
       "--dry-run", f"--root={tmp_path / 'w'}",
       f"--results={tmp_path / 'results'}"],
      cwd=REPO, env=_env(tmp_path / "cache"), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().startswith("# table1:")
  proc.stdout.close()
  _, stderr = proc.communicate(timeout=TIMEOUT_S)
  assert proc.returncode == 1
  assert stderr == ""


@pytest.mark.parametrize("name", sorted(SCALES))
def test_the_flags_a_result_names_select_its_scale_again(name):
  # Every table, overview and claims file ends with the command that wrote
  # it: `--scale=cpu-long` would be refused, `--scale=cpu --variant=long`
  # is what selects the scale whose results are under cpu-long.
  from reproduce import __main__ as cli  # pylint: disable=import-outside-toplevel
  args = cli._parser().parse_args(  # pylint: disable=protected-access
      ["table1", *scales.command_flags(name).split()])
  scale = scales.SCALES[args.scale]
  if args.variant:
    scale = scales.with_variant(scale, args.variant)
  assert scale.name == name


def test_the_runners_evaluation_costs_cover_exactly_the_attack_names():
  from fkjax.config import names as eval_names  # pylint: disable=import-outside-toplevel
  costed = set(estimate_lib._EVAL_ITERS) | {"nattack"}  # pylint: disable=protected-access
  assert costed == set(eval_names.ATTACK_NAMES)
