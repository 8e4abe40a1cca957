"""reproduce.report.claims: the paper's claims judged from result tables."""
import json

import numpy as np
import pytest

from fkjax import workdir as workdir_lib
from reproduce import __main__ as reproduce_main
from reproduce.report import claims
from reproduce.report import claims_figure
from reproduce.spec import tables


def _table(rows):
  """A results table as report.collect writes it: {row: [per-seed values]}."""
  out = []
  for name, (values, metric, images) in rows.items():
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)
           ) ** 0.5 if len(values) > 1 else 0.0
    out.append({
        "name": name,
        "summary": {metric: {"mean": mean, "std": std, "n": len(values)}},
        "runs": [{"status": "done", "test_images": images,
                  "metrics": {metric: v}} for v in values]})
  return {"rows": out}


def test_every_claim_names_rows_and_metrics_of_its_table():
  for claim in claims.CLAIMS:
    assert claim.comparisons, claim.name
    for c in claim.comparisons:
      table = tables.TABLES[c.table]
      names = {r.name for r in table.rows}
      assert {c.higher, c.lower} <= names, (claim.name, c)
      assert c.metric in table.metrics, (claim.name, c)
      assert c.lower_metric in (None, *table.metrics), (claim.name, c)


@pytest.mark.parametrize("higher,lower,metric,images,verdict", [
    # one seed: only the direction, labelled unresolved
    ([60.0], [50.0], "A1", 2000, "as the paper (unresolved)"),
    ([50.0], [60.0], "A1", 2000, "against the paper (unresolved)"),
    # 1 point on 2,000 images is inside 2 binomial standard errors (3.1)
    ([51.0, 51.2, 50.9], [50.0, 50.1, 50.0], "A1", 2000,
     "within test-sample noise"),
    # three seeds, a gap far beyond their spread
    ([60.0, 61.0, 60.5], [50.0, 50.5, 49.5], "A1", 2000, "holds"),
    ([50.0, 50.5, 49.5], [60.0, 61.0, 60.5], "A1", 2000, "reversed"),
    # three seeds, a gap inside their spread
    ([70.0, 40.0, 60.0], [45.0, 55.0, 44.0], "A1", 2000,
     "no resolved difference"),
    # sparsities have no test-sample floor
    ([30.0, 30.2, 30.1], [29.0, 29.1, 29.0], "sparsity", None, "holds"),
])
def test_a_comparison_is_judged_by_its_seeds_and_test_images(
    higher, lower, metric, images, verdict):
  table = _table({"a": (higher, metric, images), "b": (lower, metric, images)})
  out = claims.judge(claims.Comparison("t", "a", "b", metric), table)
  assert out["verdict"] == verdict
  assert out["difference"] == pytest.approx(
      sum(higher) / len(higher) - sum(lower) / len(lower))


def test_a_comparison_may_read_the_lower_row_another_way():
  # Table 4: RGSM's evaluated net against ADMM's dense w (the paper's reading)
  table = _table({"rgsm": ([48.25], "A1", 2000),
                  "admm": ([15.15], "A1", 2000)})
  table["rows"][1]["summary"]["w_A1"] = {"mean": 60.0, "std": 0.0, "n": 1}
  same = claims.judge(claims.Comparison("t", "rgsm", "admm", "A1"), table)
  dense = claims.judge(claims.Comparison("t", "rgsm", "admm", "A1", "w_A1"),
                       table)
  assert same["verdict"] == "as the paper (unresolved)"
  assert dense["lower_mean"] == 60.0
  assert dense["verdict"] == "against the paper (unresolved)"


def test_a_missing_row_or_table_is_not_yet_run():
  table = _table({"a": ([60.0], "A1", 2000)})
  comparison = claims.Comparison("t", "a", "b", "A1")
  assert claims.judge(comparison, table)["verdict"] == claims.NOT_RUN
  assert claims.judge(comparison, None)["verdict"] == claims.NOT_RUN


@pytest.mark.parametrize("verdicts,claim", [
    (["holds", "holds"], "holds"),
    (["holds", "reversed"], "does not hold"),
    ([claims.NOT_RUN, claims.NOT_RUN], claims.NOT_RUN),
    (["holds", claims.NOT_RUN, claims.NOT_RUN],
     f"open: 1 holds, 2 {claims.NOT_RUN}"),
])
def test_a_claim_holds_only_when_every_comparison_does(verdicts, claim):
  assert claims.verdict_of(verdicts) == claim


def _write_rvsm_and_admm(folder):
  """Table 4 with one seed of RVSM (67.3%) and of ADMM (80.0%) on disk."""
  folder.mkdir()
  (folder / "table4.json").write_text(json.dumps(_table({
      "rvsm": ([67.3], "w_sparsity", 2000),
      "admm_element": ([80.0], "w_sparsity", 2000)})))


def test_cli_writes_the_verdicts_of_the_tables_on_disk(tmp_path, capsys):
  folder = tmp_path / "cpu"
  _write_rvsm_and_admm(folder)
  # `python -m reproduce claims`'s main, in this process
  assert reproduce_main.main(["claims", "--scale=cpu",
                              f"--results={tmp_path}"]) == 0
  out = capsys.readouterr().out
  data = json.loads((folder / "claims.json").read_text())
  by_name = {c["name"]: c for c in data["claims"]}
  assert by_name["rvsm_sparser_than_admm"]["verdict"] == (
      "open: 1 against the paper (unresolved)")
  assert by_name["at_denser"]["verdict"] == claims.NOT_RUN
  md = (folder / "claims.md").read_text()
  assert out.endswith(md)
  # Table 4's comparison has run: the one-page figure of comparisons too.
  assert (folder / claims.FIGURE).read_bytes().startswith(b"\x89PNG")
  assert f"]({claims.FIGURE})" in md
  assert ("| rvsm_sparser_than_admm | table4 | rvsm | admm_element | "
          "w_sparsity | 67.30 - 80.00 = -12.70 | 1, 1 | — | "
          "against the paper (unresolved) |"
          in md)
  # Table 4's RVSM row is Table 1's, and trained by Table 1's command.
  assert ("- `python -m reproduce table4 --scale=cpu "
          "--rows=admm_element,admm_channel --seeds=3` "
          "(rvsm_sparser_than_admm, rgsm_beats_admm_channels)" in md)


def test_no_figure_before_any_comparison_has_run(tmp_path):
  claims.write(str(tmp_path), "cpu")
  assert (tmp_path / "cpu" / "claims.md").exists()
  assert not (tmp_path / "cpu" / claims.FIGURE).exists()
  assert claims.FIGURE not in (tmp_path / "cpu" / "claims.md").read_text()


def test_a_comparison_carries_the_papers_difference():
  table = _table({"a": ([60.0], "A1", 2000), "b": ([50.0], "A1", 2000)})
  comparison = claims.Comparison("t", "a", "b", "A1")
  assert "paper_difference" not in claims.judge(comparison, table)
  table["rows"][0]["paper"] = {"A1": 76.3}
  # one row without the paper's number: no difference
  assert "paper_difference" not in claims.judge(comparison, table)
  table["rows"][1]["paper"] = {"A1": 72.95}
  assert claims.judge(comparison, table)["paper_difference"] == (
      pytest.approx(76.3 - 72.95))
  # the dense w's reading is the paper's own number (it evaluated w)
  table["rows"][1]["summary"]["w_A1"] = {"mean": 55.0, "std": 0.0, "n": 1}
  dense = claims.judge(claims.Comparison("t", "a", "b", "A1", "w_A1"), table)
  assert dense["paper_difference"] == pytest.approx(76.3 - 72.95)


def test_the_figure_draws_each_comparison_under_its_claim():
  table = _table({"a": ([60.0, 61.0, 60.5], "A1", 2000),
                  "b": ([50.0, 50.5, 49.5], "A1", 2000),
                  "c": ([30.0, 30.2, 30.1], "sparsity", None),
                  "d": ([29.0, 29.1, 29.0], "sparsity", None)})
  table["rows"][0]["paper"] = {"A1": 70.0}
  table["rows"][1]["paper"] = {"A1": 66.0}
  judged = [
      {"name": "accurate", "comparisons": [
          claims.judge(claims.Comparison("t", "a", "b", "A1"), table),
          claims.judge(claims.Comparison("t", "a", "x", "A2"), table)]},
      {"name": "sparser", "comparisons": [
          claims.judge(claims.Comparison("t", "c", "d", "sparsity"), table)]}]
  data = {"scale": "cpu", "z": 2.0, "accuracies": ["A1", "A2", "A3"],
          "claims": judged}
  fig = claims_figure.claims_figure(data)
  accuracy, sparsity = fig.axes
  labels = lambda ax: [t.get_text() for t in ax.get_yticklabels()]
  # the claim's name heads its comparisons; one not run is left out
  assert labels(accuracy) == ["accurate", "t: a - b, A1 (3, 3 seeds)"]
  assert labels(sparsity) == ["sparser", "t: c - d, sparsity (3, 3 seeds)"]
  # fkjax's difference and the paper's (a diamond) on the comparison's line
  points = [(line.get_xdata()[0], line.get_marker()) for line in accuracy.lines
            if list(line.get_ydata()) == [1]]
  assert (pytest.approx(10.5), "o") in points
  assert (pytest.approx(4.0), "D") in points
  data["claims"] = judged[1:]
  assert claims_figure.claims_figure(data).axes[0].get_title().endswith(
      ": sparsity")


def test_what_would_settle_the_open_claims():
  judged = [
      {"name": "open_one", "verdict": "open: ...", "comparisons": [
          # shared with table2, so trained by table2's command
          {"table": "table3", "higher": "en2resnet20_rgsm_l0.05",
           "lower": "resnet38_rgsm_l0.05", "seeds": [1, 3],
           "verdict": "as the paper (unresolved)"},
          # settled whatever its seeds
          {"table": "table1", "higher": "en2resnet20_rvsm_b0.1",
           "lower": "resnet20_rvsm_b0.1", "seeds": [1, 3],
           "verdict": "within test-sample noise"},
          {"table": "table1", "higher": "en2resnet20_rvsm_b0.5",
           "lower": "resnet20_rvsm_b0.5", "seeds": [0, 0],
           "verdict": claims.NOT_RUN}]},
      {"name": "settled", "verdict": "holds", "comparisons": [
          {"table": "table1", "higher": "en2resnet20_rvsm_b0.01",
           "lower": "resnet20_rvsm_b0.01", "seeds": [1, 1],
           "verdict": "as the paper (unresolved)"}]},
  ]
  assert tables.TABLES["table3"].row("en2resnet20_rgsm_l0.05").shared == (
      "table2/en2resnet20_rgsm_l0.05")
  assert claims.to_settle(judged) == [
      {"table": "table2", "rows": ["en2resnet20_rgsm_l0.05"],
       "claims": ["open_one"]},
      {"table": "table1", "rows": ["en2resnet20_rvsm_b0.5",
                                   "resnet20_rvsm_b0.5"],
       "claims": ["open_one"]}]


def _with_correct(table, row, vectors):
  """Gives ``row``'s seeds their per-image correctness (and its accuracy)."""
  r = next(r for r in table["rows"] if r["name"] == row)
  for run, v in zip(r["runs"], vectors):
    run["correct_per_image"] = {"A1": workdir_lib.encode_correct(v)}
    assert run["metrics"]["A1"] == pytest.approx(100.0 * v.mean())


def test_a_paired_test_resolves_what_independent_samples_cannot():
  # Both nets right and wrong on the same images, except 60 of 2,000 that
  # only the first gets right: +3 points, inside 2 binomial standard errors
  # of two independent samples (3.1), far outside the paired one (0.76).
  rng = np.random.default_rng(0)
  base = rng.random(2000) < 0.5
  base[:60] = False
  better = base.copy()
  better[:60] = True
  table = _table({"a": ([100.0 * better.mean()] * 3, "A1", 2000),
                  "b": ([100.0 * base.mean()] * 3, "A1", 2000)})
  comparison = claims.Comparison("t", "a", "b", "A1")
  independent = claims.judge(comparison, table)
  assert independent["verdict"] == "within test-sample noise"
  assert not independent["paired"]
  _with_correct(table, "a", [better] * 3)
  _with_correct(table, "b", [base] * 3)
  paired = claims.judge(comparison, table)
  assert paired["paired"]
  assert paired["difference"] == pytest.approx(3.0)
  assert 2 * paired["sample_se"] == pytest.approx(
      2 * 100 * np.std(better.astype(float) - base, ddof=1) / np.sqrt(2000))
  assert paired["verdict"] == "holds"
  assert paired["paired_seeds"] == [[3, 3], [3, 3]]
  # No seed of a row kept its images: back to independent samples.
  for run in table["rows"][0]["runs"]:
    del run["correct_per_image"]
  assert claims.judge(comparison, table)["verdict"] == (
      "within test-sample noise")


def test_paired_noise_rests_on_the_seeds_that_kept_their_images():
  # Seed 2 of row a was evaluated before fkjax kept images: d uses a's
  # seeds 0-1 against all of b's, and the markdown says so.
  rng = np.random.default_rng(1)
  a = [rng.random(400) < 0.6 for _ in range(3)]
  b = [rng.random(400) < 0.5 for _ in range(3)]
  table = _table({"a": ([100.0 * v.mean() for v in a], "A1", 400),
                  "b": ([100.0 * v.mean() for v in b], "A1", 400)})
  _with_correct(table, "a", a)
  _with_correct(table, "b", b)
  full = claims.judge(claims.Comparison("t", "a", "b", "A1"), table)
  del table["rows"][0]["runs"][2]["correct_per_image"]
  out = claims.judge(claims.Comparison("t", "a", "b", "A1"), table)
  assert out["paired"] and out["paired_seeds"] == [[2, 3], [3, 3]]
  d = 100 * (np.mean(a[:2], axis=0) - np.mean(b, axis=0))
  assert out["sample_se"] == pytest.approx(np.std(d, ddof=1) / 20)
  # The difference itself is still that of every seed's accuracy.
  assert out["difference"] == pytest.approx(full["difference"])
  # Two seeds average out less image-by-image disagreement than three.
  assert out["sample_se"] > full["sample_se"]
  assert "(paired on 2/3 and 3/3 seeds)" in claims._noise_cell(out, 2.0)
  assert claims._noise_cell(full, 2.0).endswith("(paired)")


def test_paired_noise_averages_each_rows_seeds_per_image():
  # Seeds that disagree image by image: d_i is the difference of the rows'
  # seed-averaged correctness, not of one seed's.
  a = [np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0], bool)]
  b = [np.array([0, 1, 0, 0], bool), np.array([0, 1, 0, 1], bool)]
  table = _table({"a": ([50.0, 50.0], "A1", 4), "b": ([25.0, 50.0], "A1", 4)})
  _with_correct(table, "a", a)
  _with_correct(table, "b", b)
  out = claims.judge(claims.Comparison("t", "a", "b", "A1"), table)
  d = 100 * (np.mean(a, axis=0) - np.mean(b, axis=0))   # 100, -50, 50, -50
  assert out["sample_se"] == pytest.approx(np.std(d, ddof=1) / 2)
  assert out["difference"] == pytest.approx(d.mean())


def test_a_sparsity_the_last_epoch_would_turn_round_is_flagged():
  # The checkpoint rule picked epoch 1 of row a, before RGSM pruned: its
  # sparsity is below b's there, above it at the last epoch.
  table = _table({"a": ([0.22, 80.0, 82.0], "channel_sparsity", None),
                  "b": ([70.0, 71.0, 72.0], "channel_sparsity", None)})
  first = table["rows"][0]["runs"][0]
  first.update(seed=0, checkpoint_epoch=1, epochs=5,
               last_epoch_channel_sparsity=92.0)
  out = claims.judge(claims.Comparison("t", "a", "b", "channel_sparsity"),
                     table)
  assert out["verdict"] == "no resolved difference"
  assert out["early_checkpoints"] == {
      "difference_at_last_epoch": pytest.approx((92 + 80 + 82 - 213) / 3),
      "runs": {"a": ["seed 0 at epoch 1/5"]}}
  assert "at the last epoch +13.67" in claims._early_note(out)
  assert claims.verdict_of([out["verdict"]], 1).endswith(
      "; 1 on a checkpoint before the last epoch, whose sparsity goes the "
      "other way")
  # An early checkpoint whose sparsity the last epoch keeps on the same
  # side is not flagged.
  first["last_epoch_channel_sparsity"] = 1.0
  out = claims.judge(claims.Comparison("t", "a", "b", "channel_sparsity"),
                     table)
  assert "early_checkpoints" not in out


def test_an_accuracy_of_a_net_evaluated_before_it_was_pruned_is_flagged():
  # Row a's seed 0 was evaluated at epoch 1, before RGSM pruned much (0.22%
  # of channels; 80% at its last epoch): its accuracy is not the sparse
  # net's.
  table = _table({"a": ([40.0, 50.0, 52.0], "A1", None),
                  "b": ([45.0, 46.0, 47.0], "A1", None)})
  runs = table["rows"][0]["runs"]
  for seed, (run, channels) in enumerate(zip(runs, (0.22, 75.0, 80.0))):
    run.update(seed=seed, checkpoint_epoch=1 if seed == 0 else 5, epochs=5)
    run["metrics"].update(sparsity=0.03 if seed == 0 else channels,
                          channel_sparsity=channels)
  runs[0].update(last_epoch_sparsity=79.0, last_epoch_channel_sparsity=80.0)
  out = claims.judge(claims.Comparison("t", "a", "b", "A1"), table)
  note = ("seed 0 at epoch 1/5, 0.22% of channels pruned against 80.00% at "
          "the last")
  assert out["barely_pruned_checkpoints"] == {"a": [note]}
  assert claims._early_note(out) == f" (evaluated barely pruned: a {note})"
  assert claims.verdict_of([out["verdict"]], 0, 1).endswith(
      "; 1 with a row evaluated at a checkpoint its sparsifier had barely "
      "pruned")
  # An early checkpoint with a good part of the last epoch's pruning: not
  # flagged.
  runs[0]["metrics"]["channel_sparsity"] = 12.0
  out = claims.judge(claims.Comparison("t", "a", "b", "A1"), table)
  assert "barely_pruned_checkpoints" not in out
  # Nothing pruned at the last epoch either (an unpruned row): not flagged.
  runs[0]["metrics"]["channel_sparsity"] = 0.0
  runs[0].update(last_epoch_sparsity=0.0, last_epoch_channel_sparsity=0.0)
  out = claims.judge(claims.Comparison("t", "a", "b", "A1"), table)
  assert "barely_pruned_checkpoints" not in out


def test_a_variants_claims_name_the_commands_that_select_it(tmp_path):
  _write_rvsm_and_admm(tmp_path / "cpu-long")
  md = claims.markdown(claims.evaluate(str(tmp_path), "cpu-long"))
  assert ("Generated by `python -m reproduce claims --scale=cpu "
          "--variant=long` from" in md)
  assert ("- `python -m reproduce table4 --scale=cpu --variant=long "
          "--rows=admm_element,admm_channel --seeds=3`" in md)
  assert "cpu-long`" not in md.replace("the `cpu-long` scale", "")


def test_open_claims_with_nothing_left_to_run_are_named():
  def claim(name, verdict):
    return {"name": name, "claim": name, "where": "Table 1",
            "verdict": verdict, "comparisons": []}
  data = {"scale": "cpu", "min_seeds": 3, "z": 2.0,
          "claims": [claim("waits", "open: 1 as the paper (unresolved)"),
                     claim("spread", "open: 2 no resolved difference"),
                     claim("noise", "open: 1 within test-sample noise"),
                     claim("done", "holds")],
          "to_settle": [{"table": "table1", "rows": ["r"],
                         "claims": ["waits"]}]}
  md = claims.markdown(data)
  section = md.split("## Open claims with nothing left to run at this "
                     "scale")[1].split("##")[0]
  assert section.strip().endswith(": spread, noise.")
  assert "--rows=r --seeds=3` (waits)" in md
  # With every open claim waiting on runs, the section is left out.
  data["claims"] = data["claims"][:1] + data["claims"][3:]
  assert "nothing left to run" not in claims.markdown(data)
