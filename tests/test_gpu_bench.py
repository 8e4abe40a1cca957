"""``python -m benchmarks.gpu_bench --smoke``: every kind of row, at tiny
sizes on this CPU, into a JSON whose structure and numbers are checked (not
their values: they time a CPU); the rows' order, their estimates and the
budget, the flags' checks, a run stopped by SIGTERM."""
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_bench
from benchmarks import gpu_bench_epochs
from benchmarks import gpu_bench_plan
from tests.subprocess_env import subprocess_env

# Under a minute of CPU: ResNet8 step programs per precision, a sweep, a
# train.py run of two epochs and a step under XLA_FLAGS in subprocesses.
slow = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_bench")
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.gpu_bench", "--smoke",
       f"--json={out / 'bench.json'}", f"--log={out / 'bench.log'}"],
      cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
      timeout=900, check=False)
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
  assert result["stopped"] is None
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
  # every model x precision x conv PGD step, and the clean steps
  assert measured == {(model, p, c, a) for p in settings["precisions"]
                      for c in settings["conv"] for a in (k, 0)}
  (variant,) = result["xla_variants"]
  for s in result["steps"] + [variant]:
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
  # the step measured in a process with the flag, beside the same without
  assert variant["xla_flag"] == "--xla_gpu_deterministic_ops=true"
  same = next(s for s in result["steps"] if s["attack_steps"] == k
              and s["precision"] == variant["precision"])
  assert variant["baseline_step_ms_median"] == same["step_ms_median"]


@slow
def test_the_rows_ran_in_the_plans_order(smoke):
  result, _ = smoke
  rows = result["rows"]
  settings = {k: v for k, v in result["settings"].items()}
  assert [r["name"] for r in rows] == [
      r.name for r in gpu_bench_plan.plan(settings)]
  assert {r["status"] for r in rows} == {"measured"}
  for r in rows:
    assert r["estimate_s"] > 0 and r["wall_s"] > 0, r


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
  (auto,) = result["epochs"]
  assert auto["variant"] == "auto"
  for key in ("epoch1_s", "epoch_s", "train_s", "train_images_per_s",
              "val_s", "wall_s"):
    assert _positive(auto[key]), (auto, key)
  # on one device, however many are visible, as the step rows
  assert auto["devices"] == 1
  assert auto["command"].startswith("train.py --config=configs/default.py")
  assert "--config.num_devices=1" in auto["command"].split()
  # the epoch's wall time holds its training and validation
  assert auto["epoch_s"] >= auto["train_s"] + auto["val_s"]
  assert result["paper_run_minutes"] == pytest.approx(
      200 * auto["epoch_s"] / 60)


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


@slow
def test_a_run_stopped_by_sigterm_keeps_its_rows(tmp_path):
  out = tmp_path / "bench.json"
  proc = subprocess.Popen(
      [sys.executable, "-m", "benchmarks.gpu_bench", "--smoke",
       f"--json={out}"], cwd=REPO, env=subprocess_env(),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline and proc.poll() is None:
    if out.exists() and any(r.get("status") == "measured" for r in
                            json.loads(out.read_text())["rows"]):
      break
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  stdout, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 143, stdout[-2000:] + stderr[-2000:]
  result = json.loads(out.read_text())
  assert result["stopped"] == "SIGTERM"
  first, *rest = result["rows"]
  assert first["status"] == "measured"
  # the row under way when the signal came, and none after it
  assert [r["status"] for r in rest] in ([], ["stopped"])
  assert result["steps"][0]["model"] == "resnet8"
  assert "stopped by SIGTERM" in stdout


def _settings(*argv):
  return gpu_bench.settings(gpu_bench._parser().parse_args(list(argv)))  # pylint: disable=protected-access


def test_the_rows_that_set_defaults_come_first():
  rows = gpu_bench_plan.plan(_settings())
  groups = [r.group for r in rows]
  order = ["precision", "train.py", "sweep", "roofs", "clean step",
           "variants"]
  assert sorted(groups, key=order.index) == groups
  first = [(r.model, r.precision) for r in rows if r.group == "precision"]
  assert first == [(m, p) for m in ("resnet20", "en2resnet20")
                   for p in ("float32", "tf32", "bfloat16")]
  (sweep,) = [r for r in rows if r.group == "sweep"]
  assert (sweep.runs, sweep.model) == (8, "resnet20")
  variants = [r.variant for r in rows if r.group == "variants"]
  assert variants == ["conv_nhwc", "autotune_0", "deterministic", "host"]


def _step(model, precision, compile_s, step_ms, k=10):
  return {"model": model, "precision": precision, "attack_steps": k,
          "compile_s": compile_s, "step_ms_median": step_ms,
          "batch_size": 128}


def test_a_rows_estimate_comes_from_the_rows_measured():
  cfg = _settings()
  cfg["train_step"] = gpu_bench_epochs.train_shape(False, False, None)
  result = {"steps": [], "epochs": []}
  tf32 = gpu_bench_plan.Row("t", "precision", "step", "resnet20", "tf32",
                            "auto", 10)
  assert gpu_bench_plan.estimate(tf32, cfg, result)[1].startswith("a guess")
  result["steps"].append(_step("resnet20", "float32", 30.0, 100.0))
  calls = cfg["repeats"] + cfg["warmup"]
  seconds, basis = gpu_bench_plan.estimate(tf32, cfg, result)
  assert seconds == pytest.approx(1.2 * 30 + calls * 0.1)
  assert basis == "from resnet20 float32's step"
  # another model: scaled by its ensemble members
  en2 = gpu_bench_plan.Row("e", "precision", "step", "en2resnet20",
                           "float32", "auto", 10)
  assert gpu_bench_plan.estimate(en2, cfg, result)[0] == pytest.approx(
      2 * seconds)
  sweep = gpu_bench_plan.Row("s", "sweep", "sweep", "resnet20", "float32",
                             "auto", 10, runs=8)
  assert gpu_bench_plan.estimate(sweep, cfg, result)[0] == pytest.approx(
      2 * 30 + calls * 8 * 0.1)
  # train.py: from the train model's step until a train.py run is timed
  train = gpu_bench_plan.Row("train.py auto", "train.py", "train",
                             variant="auto")
  from_step, _ = gpu_bench_plan.estimate(train, cfg, result)
  assert from_step > 2 * cfg["train_step"]["steps_per_epoch"] * 0.2
  result["epochs"].append({"wall_s": 77.0})
  assert gpu_bench_plan.estimate(train, cfg, result) == (
      77.0, "from the last train.py run")


def test_a_row_that_would_not_fit_is_not_started():
  now = [0.0]
  lines, skipped, rows, ran = [], {}, [], []
  budget = gpu_bench_plan.Budget(100, lines.append, skipped, rows,
                                 clock=lambda: now[0])
  row = gpu_bench_plan.Row("a", "precision", "step")

  def run():
    now[0] += 70
    ran.append(1)
    return {"ok": 1}
  assert budget.run(row, (60.0, "x"), run) == {"ok": 1}
  late = gpu_bench_plan.Row("b", "sweep", "sweep")
  assert budget.run(late, (31.0, "from y"), run) is None
  assert ran == [1]
  assert skipped == {"b": "not run: 30 s of --max-seconds left, it needs "
                          "~31 s (from y)"}
  assert [(r["name"], r["status"], r["wall_s"]) for r in rows] == [
      ("a", "measured", 70.0), ("b", "skipped", None)]


@pytest.mark.parametrize("argv,line", [
    (["--models=nonexistent"], "--models: 'nonexistent' is not a model"),
    (["--models=cpu"], "--models: 'cpu' is not a model"),
    (["--models=resnet7"], "--models: 'resnet7': config.model.depth=7"),
    (["--precisions=float16"], "--precisions: 'float16': "),
    (["--sweep-precision=fp8"], "--sweep-precision: 'fp8': "),
    (["--conv=cudnn"], "--conv: 'cudnn': "),
    (["--xla-variants=nhwc"], "--xla-variants: 'nhwc' is none of"),
    (["--train-variants=gpu"], "--train-variants: train variant 'gpu'"),
    (["--batch-size=0"], "--batch-size: 0: at least 1"),
])
def test_a_flag_value_that_names_nothing_is_refused(argv, line):
  problem = gpu_bench.check_settings(_settings(*argv))
  assert problem.startswith(line) and "\n" not in problem
