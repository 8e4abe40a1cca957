"""The table that ends a sweep (fkjax.training.sweep.summary)."""
import io
import sys
from pathlib import Path

from fkjax.training.sweep import summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from configs import tiny  # pylint: disable=wrong-import-position


def _configs():
  configs = [tiny.get_config("rgsm") for _ in range(3)]
  for c, lamb1, seed, data_dir in zip(configs, (0.8, 0.6, 0.8), (0, 0, 1),
                                      ("/a", "/b", "/c")):
    c.sparsity.lamb1 = lamb1
    c.seed = seed
    c.dataset.data_dir = data_dir   # where, not what: not a swept value
  return configs


def _summary(val, test, sparsity, channels):
  return {"validation": {"epoch": 3, "val_natural_accuracy": val,
                         "weight_sparsity": 1.0, "channel_sparsity": 2.0},
          "test": {"attacks": {"natural": {"accuracy": test},
                               "fgsm": {"accuracy": test / 2}},
                   "weight_sparsity": sparsity,
                   "channel_sparsity": channels}}


def test_a_sweep_ends_with_one_table_of_its_runs():
  configs = _configs()
  assert summary.swept_keys(configs) == ["seed", "sparsity.lamb1"]
  # One batch stream shared by seeds 0 and 1 (recorded by the run of seed
  # 1) is not a swept value; nor is each run's own; other streams are.
  configs[2].training.data_seed = 0
  assert summary.swept_keys(configs) == ["seed", "sparsity.lamb1"]
  configs[2].training.data_seed = 1
  assert summary.swept_keys(configs) == ["seed", "sparsity.lamb1"]
  configs[1].training.data_seed = 5
  assert "training.data_seed" in summary.swept_keys(configs)
  configs[1].training.data_seed = configs[2].training.data_seed = None
  summaries = [_summary(50.0, 40.0, 10.0, 5.0), _summary(55.5, 44.25, 20, 7.5),
               {"validation": {"val_natural_accuracy": 60.0,
                               "weight_sparsity": 3.0,
                               "channel_sparsity": 4.0}}]
  stream = io.StringIO()
  returned = summary.report(configs, ["r0", "r1", "r2"], summaries,
                            stream=stream)
  assert returned is summaries
  assert stream.getvalue().splitlines() == [
      "sweep of 3 runs:",
      "| run | seed | sparsity.lamb1 | val natural % | test natural % "
      "| test fgsm % | sparsity % | channel sparsity % |",
      "| --- | --- | --- | --- | --- | --- | --- | --- |",
      "| r0 | 0 | 0.8 | 50.00 | 40.00 | 20.00 | 10.00 | 5.00 |",
      "| r1 | 0 | 0.6 | 55.50 | 44.25 | 22.12 | 20.00 | 7.50 |",
      # No final evaluation: the last epoch's sparsity, no test columns.
      "| r2 | 1 | 0.8 | 60.00 | - | - | 3.00 | 4.00 |",
  ]


def test_only_process_zero_prints():
  stream = io.StringIO()
  summary.report(_configs(), ["a", "b", "c"], [{}, {}, {}], enabled=False,
                 stream=stream)
  assert not stream.getvalue()
