"""``python -m reproduce ... --dry-run --speed-from=JSON``: GPU estimates
from the training steps ``benchmarks.gpu_bench`` measured."""
import json
import re

import pytest

from configs import default as default_config
from reproduce import __main__ as reproduce_main
from reproduce import measured_speed
from reproduce import runner
from reproduce import scales
from reproduce import tables

DEVICE = "NVIDIA Test GPU"


def _step(model, depth, members, attack_steps, ms, *, batch=128,
          precision="float32", conv="auto"):
  return {"model": model, "depth": depth, "ensemble_size": members,
          "attack_steps": attack_steps, "batch_size": batch,
          "precision": precision, "conv": conv, "step_ms_median": ms,
          "step_ms_min": ms, "images_per_s": 1e3 * batch / ms}


def _write(path, steps, smoke=False):
  path.write_text(json.dumps({
      "environment": {"device_kind": DEVICE, "date": "2026-12-06T03:00:00",
                      "jax": "0.10.2", "commit": "0123456789abcdef"},
      "settings": {"smoke": smoke}, "steps": steps}))
  return str(path)


STEPS = [
    _step("resnet20", 20, 1, 10, 20.0), _step("resnet20", 20, 1, 0, 4.0),
    _step("en2resnet20", 20, 2, 10, 40.0), _step("en2resnet20", 20, 2, 0, 8.0),
    # another conv choice and precision, which a float32 run does not read
    _step("resnet20", 20, 1, 10, 999.0, conv="xla"),
    _step("resnet20", 20, 1, 10, 10.0, precision="bfloat16"),
]


def test_step_times_are_the_runs_model_measured(tmp_path):
  speed = measured_speed.MeasuredSpeed.load(_write(tmp_path / "g.json",
                                                   STEPS))
  r20 = speed.step_times(default_config.get_config("resnet20"))
  assert r20.clean_step == pytest.approx(0.004)
  assert r20.attack_iteration == pytest.approx(0.0016)   # (20 - 4) / 10 ms
  # En2ResNet20's own steps, in the ResNet20 steps the estimates scale by
  en2 = speed.step_times(default_config.get_config("en2resnet20"))
  cost = runner.model_cost(20, 2)
  assert en2.clean_step * cost == pytest.approx(0.008)
  assert en2.attack_iteration * cost == pytest.approx(0.0032)
  # a model not measured: ResNet20's, scaled by the estimates' ratios
  en5 = speed.step_times(default_config.get_config("en5resnet20"))
  assert en5 == r20
  # a bfloat16 run reads the bfloat16 step (no clean step measured: split
  # as on the reference machine)
  bf16 = default_config.get_config("resnet20")
  bf16.precision = "bfloat16"
  times = speed.step_times(bf16)
  assert times.clean_step + 10 * times.attack_iteration == pytest.approx(
      0.010)


def test_step_times_scale_from_the_measured_batch(tmp_path):
  half = [_step("resnet20", 20, 1, 10, 10.0, batch=64),
          _step("resnet20", 20, 1, 0, 2.0, batch=64)]
  speed = measured_speed.MeasuredSpeed.load(_write(tmp_path / "g.json", half))
  times = speed.step_times(default_config.get_config("resnet20"))
  assert times.clean_step == pytest.approx(0.004)
  assert times.attack_iteration == pytest.approx(0.0016)


def test_a_file_without_steps_is_refused(tmp_path):
  with pytest.raises(ValueError, match="no PGD training step"):
    measured_speed.MeasuredSpeed.load(_write(tmp_path / "g.json",
                                             [_step("resnet20", 20, 1, 0, 4)]))
  with pytest.raises(ValueError, match="cannot read it"):
    measured_speed.MeasuredSpeed.load(str(tmp_path / "missing.json"))


def _dry_run(args, tmp_path, capsys):
  capsys.readouterr()
  code = reproduce_main.main([*args, f"--root={tmp_path / 'w'}",
                              f"--results={tmp_path / 'results'}"])
  out = capsys.readouterr()
  return code, out.out, out.err


def test_the_dry_run_estimates_for_the_measured_gpu(tmp_path, capsys):
  path = _write(tmp_path / "gpu.json", STEPS)
  args = ["table1", "--scale=gpu", "--dry-run", "--seeds=1",
          "--rows=resnet20_none,en2resnet20_none"]
  code, out, _ = _dry_run([*args, f"--speed-from={path}"], tmp_path, capsys)
  assert code == 0
  assert out.startswith(f"# estimates from the training steps of {DEVICE}, "
                        "measured 2026-12-06 (jax 0.10.2, commit 0123456)")
  estimates = re.findall(
      rf"^- (\S+) seed 0: not started, ~(\S+) on the measured {DEVICE}$",
      out, re.M)
  assert [name for name, _ in estimates] == ["resnet20_none",
                                             "en2resnet20_none"]
  # each the runner's estimate at the run's measured step times
  plan = runner.plan(tables.TABLES["table1"], scales.SCALES["gpu"],
                     rows=["resnet20_none", "en2resnet20_none"], seeds=1,
                     root=str(tmp_path / "w"),
                     results=str(tmp_path / "results"), sync=False)
  speed = measured_speed.MeasuredSpeed.load(path)
  for (_, printed), run in zip(estimates, plan):
    assert printed == runner.format_seconds(runner.estimate_seconds(
        run, step_times=speed.step_times(run.config)))
  # the table's time from scratch, on the same GPU
  scratch = runner.from_scratch_seconds(
      {"table1": ["resnet20_none", "en2resnet20_none"]}, scales.SCALES["gpu"],
      seeds=1, step_times_of=lambda run: speed.step_times(run.config))
  assert (f"from scratch ~{runner.format_seconds(scratch['table1'])} with 1 "
          "seed a row") in out
  # a GPU twice as slow: every estimate longer; the CPU reference's longer
  slow = _write(tmp_path / "slow.json",
                [{**s, "step_ms_median": 2 * s["step_ms_median"]}
                 for s in STEPS])
  _, slow_out, _ = _dry_run([*args, f"--speed-from={slow}"], tmp_path,
                            capsys)
  slower = re.findall(r"not started, ~(\S+) on the measured", slow_out)
  _, cpu_out, _ = _dry_run(args, tmp_path, capsys)
  cpu = re.findall(r"not started, ~(\S+) on 2 idle CPU cores", cpu_out)
  for fast, slow_, ref in zip(estimates, slower, cpu):
    assert _seconds(fast[1]) < _seconds(slow_) < _seconds(ref)


def test_speed_from_goes_with_a_plain_dry_run(tmp_path, capsys):
  path = _write(tmp_path / "gpu.json", STEPS)
  for extra in ([], ["--dry-run", "--calibrate"]):
    code, _, err = _dry_run(["table1", "--scale=gpu", f"--speed-from={path}",
                             *extra], tmp_path, capsys)
    assert code == 2
    assert err.strip() == ("error: --speed-from goes with --dry-run, without "
                           "--calibrate (each sets the speed it estimates "
                           "for)")
  code, _, err = _dry_run(["table1", "--scale=gpu", "--dry-run",
                           f"--speed-from={tmp_path / 'none.json'}"],
                          tmp_path, capsys)
  assert code == 2 and "cannot read it" in err


def _seconds(duration):
  """Seconds of ``runner.format_seconds``' ``1h02m`` or ``12m05s``."""
  h = re.fullmatch(r"(\d+)h(\d+)m", duration)
  if h:
    return 3600 * int(h[1]) + 60 * int(h[2])
  m = re.fullmatch(r"(\d+)m(\d+)s", duration)
  return 60 * int(m[1]) + int(m[2])
