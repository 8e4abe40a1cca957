"""reproduce.report.overview: every row run at a scale in one table."""
import json
from pathlib import Path

import pytest

from reproduce import __main__ as reproduce_main
from reproduce.report import overview
from reproduce.spec import scales

REPO = Path(__file__).resolve().parents[1]

CPU = "1 x cpu (cpu), jax 0.10.2"
GPU = "1 x NVIDIA H200 (gpu), jax 0.11.2"


def _run(seed, devices, epoch, **metrics):
  return {"seed": seed, "status": "done", "devices": devices,
          "checkpoint_epoch": epoch, "epochs": 5, "metrics": metrics}


def _row(name, label, runs, *, presets="resnet20,none", paper=None,
         shared=None, seeds=None):
  return {"name": name, "label": label, "presets": presets,
          "shared": shared, "paper": paper or {}, "runs": runs,
          "seeds": len(runs) if seeds is None else seeds}


def _tables():
  table1 = {"paper_ref": "Table 1", "rows": [
      _row("resnet20_none", {"Net": "ResNet20", "beta": "n/a"},
           [_run(0, CPU, 5, A1=52.0, sparsity=0.0),
            _run(1, GPU, 4, A1=54.0, sparsity=0.0)],
           paper={"A1": 76.07}),
      _row("resnet20_rvsm_b0.5", {"Net": "ResNet20", "beta": "0.5"},
           [{"seed": 0, "status": "not started"}],
           presets="resnet20,rvsm")]}
  table4 = {"paper_ref": "Table 4, Fig. 3", "rows": [
      _row("resnet20_none", {"Pruning": "none", "Method": "none"},
           table1["rows"][0]["runs"], shared="table1/resnet20_none"),
      _row("admm_element", {"Pruning": "unstructured", "Method": "ADMM"},
           [_run(0, CPU, 3, A1=40.0, w_A1=48.0, sparsity=80.0,
                 w_sparsity=0.0)],
           presets="resnet20,admm", paper={"A1": 71.55, "sparsity": 10.92})]}
  return {"table1": table1, "table4": table4}


def test_each_row_once_with_its_seeds_machines_and_the_papers_number():
  lines, not_run = overview.lines_of(_tables())
  by_label = {cells[0]: cells[1:] for cells in lines}
  # The row Table 4 shares is listed at Table 1, which trains it.
  base = by_label["Table 1: ResNet20 (also Table 4)"]
  assert base[0] == "53.00 ± 1.41 (76.07)"
  assert base[-3:] == ["2/2", "5, 4 of 5", "cpu (seed 0), NVIDIA H200 (seed 1)"]
  assert not any(label.startswith("Table 4: none") for label in by_label)
  assert not_run == ["Table 1: ResNet20, RVSM, β = 0.5"]


def test_admm_has_a_line_per_reading_and_the_papers_numbers_on_w():
  lines, _ = overview.lines_of(_tables())
  by_label = {cells[0]: cells[1:] for cells in lines}
  u = by_label["Table 4: unstructured, ADMM: the projection u "
               "(fkjax's reading)"]
  w = by_label["Table 4: unstructured, ADMM: the dense w (the paper's "
               "reading)"]
  assert (u[0], u[4]) == ("40.00", "80.00")
  assert (w[0], w[4]) == ("48.00 (71.55)", "0.00 (10.92)")
  assert w[3] == "—"   # the dense w has no A4 of its own
  assert w[-1] == "cpu"


def test_cli_writes_the_overview_of_the_tables_on_disk(tmp_path, capsys):
  folder = tmp_path / "cpu"
  folder.mkdir()
  for name, data in _tables().items():
    (folder / f"{name}.json").write_text(json.dumps(data))
  # `python -m reproduce overview`'s main, in this process
  assert reproduce_main.main(["overview", "--scale=cpu",
                              f"--results={tmp_path}"]) == 0
  out = capsys.readouterr().out
  md = (folder / "overview.md").read_text()
  assert out.endswith(md)
  assert "| Table 1: ResNet20 (also Table 4) | 53.00 ± 1.41 (76.07) |" in md
  assert "Not yet run: Table 1: ResNet20, RVSM, β = 0.5." in md
  assert (folder / overview.PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("scale", ["cpu", "cpu-long"])
def test_the_committed_overview_is_current(scale):
  tables = overview.load(str(REPO / "results"), scale)
  if not tables:
    pytest.skip(f"no committed {scale} results")
  committed = (REPO / "results" / scale / overview.FILE).read_text()
  assert committed == overview.markdown(tables, scale), (
      f"results/{scale}/overview.md is stale: python -m reproduce "
      f"overview {scales.command_flags(scale)}")


def test_a_shared_row_is_listed_where_its_owner_is_not_written_yet():
  tables = _tables()
  del tables["table1"]
  lines, _ = overview.lines_of(tables)
  labels = [cells[0] for cells in lines]
  assert labels[0] == "Table 4: none, none"
  assert lines[0][1] == "53.00 ± 1.41"   # Table 4 gives no paper number here


def test_a_variants_overview_names_the_command_that_writes_it():
  md = overview.markdown(_tables(), "cpu-long")
  assert md.startswith("# Every row run at the `cpu-long` scale")
  assert ("`python -m reproduce overview --scale=cpu --variant=long`"
          in md)
  assert "`python -m reproduce overview --scale=cpu` " in (
      overview.markdown(_tables(), "cpu"))


def test_the_figures_points_are_the_rows_with_both_numbers():
  points = overview.points_of(_tables())
  (a1_base, a1_admm) = points["A1"]
  assert a1_base["label"] == "Table 1: ResNet20 (also Table 4)"
  assert (a1_base["paper"], a1_base["mean"], a1_base["seeds"]) == (
      76.07, 53.0, 2)
  assert a1_base["std"] == pytest.approx(1.41421356)
  assert a1_base["values"] == [52.0, 54.0]
  # ADMM: the dense w's numbers, the reading the paper's belong to
  assert (a1_admm["where"], a1_admm["paper"], a1_admm["mean"],
          a1_admm["std"]) == ("Table 4", 71.55, 48.0, 0.0)
  # the unpruned row's 0 = 0 is no evidence: only the ADMM row is plotted
  assert [(p["paper"], p["mean"]) for p in points["sparsity"]] == [
      (10.92, 0.0)]
  assert points["A3"] == [] and points["channel_sparsity"] == []


def test_the_figure_is_drawn_where_a_row_has_both_numbers(tmp_path):
  path = str(tmp_path / "overview.png")
  assert overview.figure(_tables(), "cpu", path) == path
  assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  # Each seed is a dot at its row's paper number, beside the row's mean.
  a1 = overview.overview_figure(_tables(), "cpu").axes[0]
  assert sorted(tuple(map(float, xy)) for c in a1.collections
                for xy in c.get_offsets()) == [
                    (71.55, 48.0), (76.07, 52.0), (76.07, 54.0)]
  assert a1.get_ylim()[1] > 54.0
  tables = _tables()
  for data in tables.values():
    for row in data["rows"]:
      row["paper"] = {}
  assert overview.figure(tables, "cpu", str(tmp_path / "none.png")) is None
  assert not (tmp_path / "none.png").exists()


def test_rank_correlation_is_spearmans_rho_with_ties():
  stats = pytest.importorskip("scipy.stats")
  x = [0.0, 0.0, 10.0, 25.0, 25.0, 40.0, 56.7]
  y = [3.0, 1.0, 45.0, 71.9, 73.0, 0.2, 88.0]
  assert overview.rank_correlation(x, y) == pytest.approx(
      stats.spearmanr(x, y).statistic)
  assert overview.rank_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
  assert overview.rank_correlation([1, 2], [1, 2]) is None
  assert overview.rank_correlation([1, 2, 3], [5, 5, 5]) is None
