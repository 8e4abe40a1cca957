"""The cpu scale's calibration pilots: their configs are what the docs say."""
import pytest

from reproduce import pilot
from reproduce.spec import scales


def _decay(config) -> float:
  """Summed lr x weight decay over the schedule: what shrinks a weight."""
  return scales.learning_rate_sum(config) * config.training.weight_decay


@pytest.mark.parametrize("name", sorted(pilot.PILOTS))
def test_every_pilot_builds_on_the_cpu_scale(name):
  config = pilot.pilot_config(name)
  cpu = scales.build_config("resnet20,none", {}, scales.SCALES["cpu"],
                            seed=0)
  assert config.dataset.name == cpu.dataset.name
  assert config.attack.num_steps == cpu.attack.num_steps
  assert "natural" in config.eval.final_attacks.split(",")


@pytest.mark.parametrize("name", ["rgsm_m4_x2", "at_m4_x2"])
def test_a_doubled_schedule_at_m4_has_the_scales_summed_decay(name):
  doubled = pilot.pilot_config(name)
  scale = scales.build_config(pilot.PILOTS[name]["presets"],
                              {"sparsity.lamb1": 0.1}
                              if "rgsm" in name else {},
                              scales.SCALES["cpu"], seed=0)
  t = doubled.training
  assert t.num_epochs == 2 * scale.training.num_epochs
  assert tuple(t.lr_boundaries) == tuple(
      2 * b for b in scale.training.lr_boundaries)
  # half the scale's weight decay (m = 4, not 8) over twice the steps
  assert t.weight_decay == pytest.approx(scale.training.weight_decay / 2)
  assert _decay(doubled) == pytest.approx(_decay(scale), rel=1e-6)
  if "rgsm" in name:
    # thresholds x m^-1/4: lambda1 x m^-1/2, beta as in the paper
    assert doubled.sparsity.lamb1 == pytest.approx(0.1 / 2)
    assert doubled.sparsity.beta == scale.sparsity.beta


def _pilot_result(name, test_accuracy=None):
  out = {
      "pilot": name, "settings": {"presets": "resnet20,rgsm"},
      "config": {"training.weight_decay": 2e-3, "sparsity.method": "rgsm",
                 "sparsity.lamb1": 0.05, "sparsity.beta": 1.0},
      "wall_seconds": 600.0,
      "epochs": [{"val_natural_accuracy": 40.0},
                 {"val_natural_accuracy": 50.0}],
      "test_natural_accuracy": 51.25,
      "analysis": {"u": {"zero_share": 60.0, "channel_sparsity": 65.0},
                   "w": {"channel_norm_quantiles":
                         {"0.1": 0.0, "0.5": 0.3, "0.9": 0.6}}},
  }
  if test_accuracy is not None:
    out["test_accuracy"] = test_accuracy
  return out


def test_the_summary_lists_pilots_only_with_a3_where_measured(tmp_path):
  import json
  for name, out in [
      ("old", _pilot_result("old")),
      ("new", _pilot_result("new", {"natural": 51.25, "ifgsm20": 30.5})),
      # a result of another kind kept in the same folder
      ("admm_rho", {"rho": 0.01, "test": {"natural": 20.45}})]:
    (tmp_path / f"{name}.json").write_text(json.dumps(out))
  rows = pilot.summary(str(tmp_path)).splitlines()[2:]
  assert len(rows) == 2
  cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")]
           for r in rows}
  assert cells["new"][7:9] == ["51.2", "30.5"]
  assert cells["old"][7:9] == ["51.2", "-"]
  assert cells["new"][6] == "40.0 / 50.0"


@pytest.mark.parametrize("argv, message", [
    ([], "name the pilots to run, or ask for --summary"),
    (["--summary", "--results=/no/such/folder"],
     "no pilot results in /no/such/folder"),
    (["--plot=x.png", "--results=/no/such/folder"],
     "no pilot results in /no/such/folder"),
    (["no_such_pilot"], "invalid choice: 'no_such_pilot'"),
])
def test_a_bad_command_line_is_one_error_line(argv, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    pilot.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert message in err[-1]
  assert err[-1].startswith("python -m reproduce.pilot: error:")


def test_the_doubled_rgsm_pilot_trains_table2s_row_of_the_long_variant():
  from fkjax.training import precision
  from reproduce.run import plan as plan_lib
  from reproduce.spec import tables
  scale = scales.with_variant(scales.SCALES["cpu"], "long")
  (run,) = plan_lib.plan(tables.TABLES["table2"], scale, root="w", seeds=1,
                         rows=["resnet20_rgsm_l0.1"])
  row = scales.flat(run.config)
  # as the pilot's run records it (train_runs resolves "auto")
  mine = scales.flat(precision.resolved(pilot.pilot_config("rgsm_m4_x2")))
  differ = {k for k in set(row) | set(mine) if row.get(k) != mine.get(k)}
  # the pilot evaluates A1 and A3 only, at the end of its training
  assert differ == {"eval.final_attacks"}


def test_the_rgsm_pilots_are_drawn_by_m_and_a_stopped_one_says_so(
    tmp_path, capsys):
  import json
  def epochs(accuracies, sparsities):
    return [{"epoch": i + 1, "val_natural_accuracy": a, "channel_sparsity": c}
            for i, (a, c) in enumerate(zip(accuracies, sparsities))]
  # a pilot that finished (its JSON), one stopped after an epoch (only its
  # metrics), and an RVSM pilot, which is not drawn
  (tmp_path / "rgsm_m6.json").write_text(json.dumps(
      {**_pilot_result("rgsm_m6"), "epochs": epochs([35.5, 27.9],
                                                    [0.0, 47.3])}))
  (tmp_path / "rgsm_m1_full.metrics.jsonl").write_text("\n".join(
      json.dumps(r) for r in epochs([38.6], [0.0])) + "\n")
  (tmp_path / "rvsm_m6.json").write_text(json.dumps(
      {**_pilot_result("rvsm_m6"), "epochs": epochs([38.2], [0.0])}))
  curves = pilot.rgsm_curves(str(tmp_path))
  assert list(curves) == [
      "m = 1, cpu schedule, stopped after epoch 1 (rgsm_m1_full)",
      "m = 6, first 2 epochs (rgsm_m6)"]
  assert [r["channel_sparsity"] for r in curves[
      "m = 6, first 2 epochs (rgsm_m6)"]] == [0.0, 47.3]
  png = tmp_path / "curves.png"
  assert pilot.main([f"--results={tmp_path}", f"--plot={png}"]) == 0
  assert png.read_bytes().startswith(b"\x89PNG")
  assert capsys.readouterr().out.strip() == f"drawn: {png}"
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(SystemExit):
    pilot.main([f"--results={empty}", f"--plot={png}"])
  assert "no RGSM pilot in" in capsys.readouterr().err
