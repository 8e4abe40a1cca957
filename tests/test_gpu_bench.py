"""``python -m benchmarks.gpu_bench --smoke``: every measurement, at tiny
sizes on this CPU, into a JSON whose structure and numbers are checked (not
their values: they time a CPU)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_bench_epochs
from tests.subprocess_env import subprocess_env
from tests.subprocess_env import TIMEOUT_S

# A minute of CPU: one ResNet8 step program per precision, a sweep, two
# train.py runs of two epochs in subprocesses.
slow = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_bench")
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.gpu_bench", "--smoke",
       f"--json={out / 'bench.json'}", f"--log={out / 'bench.log'}"],
      cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
      timeout=TIMEOUT_S, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads((out / "bench.json").read_text()), out


def _positive(value):
  return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@slow
def test_the_environment_is_recorded(smoke):
  result, _ = smoke
  env = result["environment"]
  for key in ("date", "commit", "device_kind", "platform", "jax", "jaxlib"):
    assert env[key], key
  assert env["platform"] == "cpu"
  assert result["settings"]["smoke"] is True
  assert result["skipped"] == {}
  # where train.py's images came from, in words
  assert result["train_data"].startswith(("CIFAR-10 (", "synthetic"))


@slow
def test_every_measurement_is_a_positive_finite_number(smoke):
  result, _ = smoke
  roofs = result["roofs"]
  for key in ("matmul_bf16_tflops", "matmul_float32_tflops",
              "matmul_float32_highest_tflops", "copy_gb_per_s"):
    assert _positive(roofs[key]), key
  settings = result["settings"]
  measured = {(s["model"], s["precision"], s["conv"], s["attack_steps"])
              for s in result["steps"]}
  model = settings["models"][0]
  k = settings["attack_steps"]
  # every model x precision x conv PGD step, and the clean step
  assert measured == {(model, p, c, k) for p in settings["precisions"]
                      for c in settings["conv"]} | {
                          (model, settings["precisions"][0],
                           settings["conv"][0], 0)}
  for s in result["steps"]:
    for key in ("step_ms_median", "step_ms_min", "images_per_s",
                "compile_s", "flops_per_step", "tflops_per_s"):
      assert _positive(s[key]), (s, key)
    assert s["step_ms_min"] <= s["step_ms_median"]
    assert s["tflops_per_s"] == pytest.approx(
        s["flops_per_step"] / (s["step_ms_median"] / 1e3) / 1e12)
  pgd = {s["attack_steps"]: s for s in result["steps"]
         if s["precision"] == "float32"}
  # XLA counts the attack's arithmetic in every iteration
  assert pgd[k]["flops_per_step"] > 1.5 * pgd[0]["flops_per_step"]


@slow
def test_the_sweep_is_compared_with_one_run(smoke):
  result, _ = smoke
  (sweep,) = result["sweeps"]
  assert sweep["runs"] == result["settings"]["sweep_sizes"][0] == 2
  for key in ("step_ms_median", "images_per_s", "speedup",
              "single_run_step_ms_median"):
    assert _positive(sweep[key]), key
  assert sweep["speedup"] == pytest.approx(
      2 * sweep["single_run_step_ms_median"] / sweep["step_ms_median"])


@slow
def test_train_py_epochs_and_the_paper_run(smoke):
  result, _ = smoke
  variants = [e["variant"] for e in result["epochs"]]
  assert variants == result["settings"]["train_variants"] == ["auto", "host"]
  for e in result["epochs"]:
    for key in ("epoch1_s", "epoch_s", "train_images_per_s", "val_s",
                "wall_s"):
      assert _positive(e[key]), (e, key)
    assert e["command"].startswith("train.py --config=configs/default.py")
  assert result["epochs"][1]["overrides"] == {
      "training.data_pipeline": "host"}
  auto = result["epochs"][0]
  assert result["paper_run_minutes"] == pytest.approx(
      200 * (auto["epoch_s"] + auto["val_s"]) / 60)


@slow
def test_the_log_and_the_dry_run_read_it(smoke):
  result, out = smoke
  log = (out / "bench.log").read_text()
  assert "paper_run_minutes" in log and "summary" in log
  from configs import default as default_config  # pylint: disable=import-outside-toplevel
  from reproduce.run import measured_speed  # pylint: disable=import-outside-toplevel
  speed = measured_speed.MeasuredSpeed.load(str(out / "bench.json"))
  assert speed.smoke and "a --smoke run" in speed.describe()
  times = speed.step_times(default_config.get_config("resnet20"))
  assert _positive(times.clean_step) and _positive(times.attack_iteration)
  assert result["environment"]["device_kind"] in speed.describe()


@pytest.mark.parametrize("text,overrides", [
    ("auto", {}),
    ("device", {"training.data_pipeline": "device"}),
    ("host", {"training.data_pipeline": "host"}),
])
def test_train_variants(text, overrides):
  assert gpu_bench_epochs.parse_variant(text) == overrides


@pytest.mark.parametrize("text", ["gpu", "host:1", "Device"])
def test_a_bad_train_variant_is_refused(text):
  with pytest.raises(ValueError, match="train variant"):
    gpu_bench_epochs.parse_variant(text)
