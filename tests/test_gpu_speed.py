"""benchmarks/gpu_speed.py (via gpu_session.sh): the GPU-speed figures."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A CPU run of the GPU session script, its rows at smoke size: minutes of
# CPU for a script that only a lent GPU runs for real.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("device", "date", "commit", "resnet20_epoch_s",
          "en2resnet20_epoch_s", "resnet20_sweep8_speedup",
          "paper_run_minutes", "bf16_matmul_tflops")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """One SMOKE=1 run of the session script on this CPU."""
  out = tmp_path_factory.mktemp("gpu_speed")
  # a part of the reproduction queue's data, carried along
  datapack = tmp_path_factory.mktemp("datapack")
  (datapack / "cifar10.xz.part-00").write_bytes(b"part 0")
  env = {**os.environ, "SMOKE": "1", "OUT": str(out), "PY": sys.executable,
         "BUDGET": "900", "DATAPACK": str(datapack),
         "STAGE": str(out / "stage")}
  proc = subprocess.run(["bash", str(REPO / "benchmarks/gpu_session.sh")],
                        cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=1200)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return out, proc.stdout


def test_session_writes_every_field_of_gpu_latest(smoke):
  out, _ = smoke
  latest = json.loads((out / "gpu_latest.json").read_text())
  for field in FIELDS:
    assert field in latest, field
  assert latest["resnet20_epoch_s"] > 0
  assert latest["en2resnet20_epoch_s"] > 0
  assert latest["resnet20_sweep8_speedup"] > 0
  assert latest["bf16_matmul_tflops"] > 0
  runs = {r["row"]: r for r in latest["rows"]}
  # a paper run: 200 epochs of the measured epoch plus its validation
  r = runs["resnet20_new"]
  assert latest["paper_run_minutes"]["resnet20"] == pytest.approx(
      200 * (r["epoch_s"] + r["val_s"]) / 60)
  # the sweep's speed-up is its aggregate images/s over today's one run
  assert latest["resnet20_sweep8_speedup"] == pytest.approx(
      runs["resnet20_sweep8"]["images_per_s"]
      / runs["resnet20_today"]["images_per_s"])
  assert runs["resnet20_sweep8"]["runs"] == 2
  # every row either measured or said why not
  assert set(runs) | set(latest["skipped"]) == {
      "resnet20_new", "resnet20_today", "resnet20_sweep8", "en2resnet20_new",
      "resnet20_new_bf16"}
  raw = [json.loads(line) for line in
         (out / "gpu_speed_rows.jsonl").read_text().splitlines()]
  assert [r["row"] for r in raw] == [r["row"] for r in latest["rows"]]


def test_session_prints_the_table_last(smoke):
  out, stdout = smoke
  tail = stdout.strip().splitlines()[-3:]
  assert tail[-1].startswith("=== ") and "done (rc=0)" in tail[-1]
  assert tail[-2].startswith("bf16 matmul:")
  assert (out / "log.txt").read_text().strip().endswith("done (rc=0)")


def test_session_stages_the_carried_data_part(smoke):
  out, _ = smoke
  assert (out / "stage" / "cifar10.xz.part-00").read_bytes() == b"part 0"


def test_todays_path_is_the_host_pipeline_one_step_per_dispatch(
    monkeypatch):
  sys.path.insert(0, str(REPO))
  from benchmarks import gpu_speed
  row = gpu_speed.Row("r", "resnet20", "today", runs=3)
  configs = gpu_speed.row_configs(row)
  assert [c.seed for c in configs] == [0, 1, 2]
  for key, value in gpu_speed.TODAY.items():
    node = configs[0]
    *parents, leaf = key.split(".")
    for p in parents:
      node = node.get(p) if node is not None else None
    if node is not None and leaf in node:   # keys this fkjax has
      assert node[leaf] == value, key
  # a short row: SHORT_STEPS batches, one data order for the sweep
  c = configs[0]
  assert (c.dataset.synthetic_sizes[0] - c.dataset.val_size
          == gpu_speed.SHORT_STEPS * gpu_speed.BATCH)
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  assert {build.data_seed(c) for c in configs} == {0}
