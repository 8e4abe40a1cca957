"""Every file a tool reads back is checked (fkjax.readback): a damaged or
foreign one is named in one line, never read as missing (which changed a
table, a claim or a resume without a word)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from configs import default as default_config
from fkjax import readback
from fkjax import workdir as workdir_lib
from fkjax.config import record as run_config
from reproduce import __main__ as reproduce_main
from reproduce.report import claims as claims_lib
from reproduce.report import overview as overview_lib
from reproduce.run import plan as plan_lib
from reproduce.run import standing as standing_lib
from reproduce.spec import scales
from reproduce.spec import tables

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _truncate(path: Path) -> None:
  text = path.read_text()
  path.write_text(text[: len(text) // 2])


def test_the_reader_names_the_file_and_what_is_wrong(tmp_path):
  path = tmp_path / "r.json"
  assert readback.read_json(path) is None   # missing: None
  path.write_text('{"done": tru')
  with pytest.raises(readback.DamagedFileError, match=f"^{path} .*not whole"):
    readback.read_json(path)
  path.write_text("")
  with pytest.raises(readback.DamagedFileError, match="empty"):
    readback.read_json(path)
  path.write_text('{"fingerprints": {"train": [1]}, "done": true}')
  with pytest.raises(readback.DamagedFileError,
                     match="fingerprints.train is a list, not a string"):
    readback.read_json(path, {"done": bool,
                              "fingerprints": readback.MapOf(str)})
  with pytest.raises(readback.DamagedFileError, match="is a list, not an"):
    path.write_text("[]")
    readback.read_json(path)
  path.write_text('{"a": 1, "b": null, "c": true}')
  assert readback.read_json(path, {"a": readback.NUMBER, "b?": str}) == {
      "a": 1, "b": None, "c": True}
  with pytest.raises(readback.DamagedFileError, match="c is true or false"):
    readback.read_json(path, {"c": readback.NUMBER})


def _one_run(tmp_path):
  """table1's resnet20_none seed 0 as its committed copy under a copy of
  results/cpu shows it (read in place, nothing restored)."""
  results = tmp_path / "results"
  shutil.copytree(RESULTS / "cpu", results / "cpu")
  run = plan_lib.plan(tables.TABLES["table1"], scales.SCALES["cpu"],
                      rows=["resnet20_none"], seeds=1,
                      root=str(tmp_path / "w"), results=str(results),
                      sync=False)[0]
  return results, standing_lib.status_view(run)


def test_a_damaged_run_record_is_named_not_read_as_not_started(tmp_path):
  _, run = _one_run(tmp_path)
  assert standing_lib.finished(run)
  record = Path(run.workdir) / "reproduce_run.json"
  _truncate(record)
  for read in (standing_lib.finished, standing_lib.status_of):
    with pytest.raises(readback.DamagedFileError, match=str(record)):
      read(run)
  # Whole JSON of another shape is as damaged.
  record.write_text(json.dumps({"done": "yes"}))
  with pytest.raises(readback.DamagedFileError, match="done is a string"):
    standing_lib.finished(run)


def test_a_damaged_eval_result_is_named(tmp_path):
  _, run = _one_run(tmp_path)
  result = Path(run.workdir) / "eval_paper.json"
  result.write_text(json.dumps({"attacks": {"natural": {"accuracy": "90"}}}))
  with pytest.raises(readback.DamagedFileError,
                     match="attacks.natural.accuracy is a string"):
    workdir_lib.read_results(result)


def test_a_damaged_table_is_named_not_left_out_of_claims(tmp_path):
  results, _ = _one_run(tmp_path)
  table = results / "cpu" / "table2.json"
  _truncate(table)
  with pytest.raises(readback.DamagedFileError, match=str(table)):
    claims_lib.evaluate(str(results), "cpu")
  with pytest.raises(readback.DamagedFileError, match=str(table)):
    overview_lib.load(str(results), "cpu")


@pytest.mark.parametrize("data", [
    [], {"steps": {}}, {"steps": [1]}, {"steps": [{"depth": "20"}]},
    {"steps": [{"depth": 20, "ensemble_size": 1, "batch_size": 128,
                "step_ms_median": "fast"}]},
])
def test_a_speed_file_of_another_shape_is_one_line(tmp_path, capsys, data):
  path = tmp_path / "gpu.json"
  path.write_text(json.dumps(data))
  code = reproduce_main.main(["table1", "--scale=gpu", "--dry-run",
                              "--seeds=1", "--rows=resnet20_none",
                              f"--speed-from={path}",
                              f"--root={tmp_path / 'w'}",
                              f"--results={tmp_path / 'r'}"])
  err = capsys.readouterr().err
  assert code == 2
  assert err.startswith(f"error: --speed-from={path} ")
  assert err.count("\n") == 1


def _checkpoint_recording(workdir: Path, step: int, config) -> None:
  step_dir = workdir / "checkpoints" / str(step)
  step_dir.mkdir(parents=True)
  (step_dir / "_CHECKPOINT_METADATA").write_text(json.dumps(
      {"custom_metadata": {"fkjax": {"run_config": config}}}))


def test_an_emptied_config_is_compared_with_the_checkpoints_record(tmp_path):
  config = default_config.get_config("resnet20")
  _checkpoint_recording(tmp_path, 12, run_config.as_dict(config))
  (tmp_path / "config.json").write_text("{}")
  other = default_config.get_config("resnet20")
  other.training.batch_size = 32
  with pytest.raises(run_config.ConfigError,
                     match=r"config.json lacks .*its checkpoint step 12 .*"
                     r"config.training.batch_size: checkpoint 128, now 32"):
    run_config.check_same_run(other, str(tmp_path))
  run_config.check_same_run(config, str(tmp_path))   # its own config: fine
  # A record made while config.json was cut down is as incomplete: the
  # latest whole one counts.
  _checkpoint_recording(tmp_path, 24, {})
  with pytest.raises(run_config.ConfigError, match="step 12"):
    run_config.check_same_run(other, str(tmp_path))


def test_an_incomplete_config_without_a_whole_record_is_refused(tmp_path):
  config = default_config.get_config("resnet20")
  saved = run_config.as_dict(config)
  del saved["training"]["batch_size"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  _checkpoint_recording(tmp_path, 12, saved)
  with pytest.raises(run_config.ConfigError,
                     match="lacks config.training.batch_size, and the "
                     "checkpoints .* do not record the config"):
    run_config.check_same_run(config, str(tmp_path))


def test_a_config_that_is_not_an_object_is_named(tmp_path):
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(run_config.ConfigError,
                     match=f"{tmp_path / 'config.json'} .*is a list"):
    run_config.load_saved(str(tmp_path))


def test_a_damaged_result_file_is_named_before_the_evaluation(tmp_path):
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  config = default_config.get_config("resnet20")
  path = Path(workdir_lib.eval_result_path(str(tmp_path), config))
  path.write_text('{"attacks": ')
  # Named before anything is restored (this workdir has no checkpoint).
  with pytest.raises(readback.DamagedFileError, match=str(path)):
    eval_run.evaluate_checkpoint(config, str(tmp_path))
