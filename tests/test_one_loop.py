"""A single run and a sweep share one training loop (fkjax.training.train): a
sweep of one run writes the single run's records and selects and evaluates
its checkpoint.

Both train the same tiny run in this process (ResNet8, PGD-1, 2 epochs of 2
steps, selection by PGD-1 accuracy), once through
``train.train_and_evaluate`` and once through ``sweep.train_sweep``. With
seed 16 its validation accuracy falls in the second epoch (6.25% -> 0%), so
the best checkpoint is not the latest.
"""
import json
import time

import numpy as np
import pytest

from configs import tiny
from fkjax import checkpoint as ckpt_lib
from fkjax.training import program
from fkjax.training import sweep
from fkjax.training import train
from fkjax.training import validation
from fkjax.workdir import metric_logging

# The loop's own times, which no two runs share.
TIMES = ("time", "train_seconds", "train_images_per_second", "val_seconds",
         "epoch_seconds")
SWEEP_ONLY = {"sweep_runs", "sweep_images_per_second"}


def _config():
  config = tiny.get_config()
  config.num_devices = 1
  config.seed = 16
  config.dataset.synthetic_sizes = (48, 16)   # train 32: 2 steps an epoch
  config.dataset.val_size = 16
  config.training.num_epochs = 2
  config.training.lr_boundaries = (1,)
  config.attack.num_steps = 1
  config.validation.attack_steps = 1
  config.validation.select_by = "pgd"
  config.eval.final_attacks = "natural"
  config.compilation_cache_dir = ""
  return config


# Added to each validation, inside what the loop times as val_seconds.
VALIDATION_PAUSE = 0.5
# Added to the loss check and the save, outside train_seconds and
# val_seconds, inside an epoch's wall time (epoch_seconds).
HOST_PAUSE = 0.3


def _paused(method, pause=VALIDATION_PAUSE):
  def slower(self, *args, **kwargs):
    time.sleep(pause)
    return method(self, *args, **kwargs)
  return slower


@pytest.fixture(scope="module")
def both(tmp_path_factory):
  root = tmp_path_factory.mktemp("one_loop")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(program.Runs, "validate", _paused(program.Runs.validate))
    for method in ("weights_loss", "save"):
      patch.setattr(program.Runs, method,
                    _paused(getattr(program.Runs, method), HOST_PAUSE))
    single = train.train_and_evaluate(_config(), str(root / "single"))
    swept, = sweep.train_sweep([_config()], [root / "sweep"])
  return {"single": (root / "single", single),
          "sweep": (root / "sweep", swept)}


def _best_step(workdir):
  checkpointer = ckpt_lib.Checkpointer(str(workdir), must_exist=True)
  try:
    return checkpointer.best_step(), checkpointer.all_steps()
  finally:
    checkpointer.close()


@pytest.mark.slow
def test_a_sweep_of_one_writes_the_single_runs_records(both):
  (single_dir, single), (sweep_dir, swept) = both["single"], both["sweep"]
  records = {name: metric_logging.read_metrics(str(d)) for name, d in
             (("single", single_dir), ("sweep", sweep_dir))}
  assert [r["epoch"] for r in records["single"]] == [1, 2]
  assert [r["step"] for r in records["single"]] == [2, 4]
  for one, other in zip(records["single"], records["sweep"]):
    assert other["sweep_runs"] == 1
    assert list(one) == [k for k in other if k not in SWEEP_ONLY]
    for key, value in one.items():
      if key in TIMES:
        continue
      # the sweep's step is the single run's under vmap: equal to rounding
      np.testing.assert_allclose(other[key], value, rtol=1e-4, err_msg=key)
  # what train_and_evaluate returns: the last record and the test result
  assert set(single) == set(swept) == {"validation", "test"}
  assert single["validation"]["epoch"] == swept["validation"]["epoch"] == 2


@pytest.mark.slow
def test_the_validation_seconds_are_the_loops_wall_time_in_both(both):
  # The loop times Runs.validate itself: a run and a sweep report the same
  # thing (it was the attacks' summed seconds in a run, wall time in a
  # sweep), and it holds all the validation took.
  for workdir, _ in both.values():
    for record in metric_logging.read_metrics(str(workdir)):
      assert record["val_seconds"] >= VALIDATION_PAUSE


@pytest.mark.slow
def test_an_epochs_wall_time_holds_its_loss_check_and_the_last_save(both):
  # epoch_seconds runs from one epoch's record to the next: what
  # benchmarks.gpu_bench multiplies by 200 is all the loop spent.
  for workdir, _ in both.values():
    first, second = metric_logging.read_metrics(str(workdir))
    for record, pauses in ((first, 1), (second, 2)):   # + epoch 1's save
      assert record["epoch_seconds"] >= (
          record["train_seconds"] + record["val_seconds"]
          + pauses * HOST_PAUSE)


@pytest.mark.slow
def test_a_sweep_of_one_selects_and_evaluates_the_single_runs_checkpoint(
    both):
  (single_dir, single), (sweep_dir, swept) = both["single"], both["sweep"]
  best, steps = _best_step(single_dir)
  assert (best, steps) == _best_step(sweep_dir)
  assert steps == [2, 4]
  # the best by PGD-1 validation accuracy, as the records say
  records = metric_logging.read_metrics(str(single_dir))
  accuracy = {r["step"]: r["val_pgd1_accuracy"] for r in records}
  assert accuracy[best] == max(accuracy.values()) > accuracy[4]
  assert best == 2
  for result, workdir in ((single["test"], single_dir),
                          (swept["test"], sweep_dir)):
    assert result["step"] == best
    saved = json.loads((workdir / "final_eval.json").read_text())
    assert saved["step"] == best
  assert (single["test"]["attacks"]["natural"]["accuracy"]
          == swept["test"]["attacks"]["natural"]["accuracy"])


def test_the_selection_column_follows_select_by():
  config = _config()
  assert validation.selection_column(config) == "pgd1"
  config.validation.select_by = "natural"
  assert validation.selection_column(config) == "natural"
