"""The PNG figures: the whole conv layer, and the training curves."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from fkjax.evaluation import plots
from fkjax.workdir import metric_logging

REPO = Path(__file__).resolve().parents[1]


def test_conv_filters_draw_the_whole_layer_and_mark_the_pruned():
  # A 32x32 kernel was cut to its first 16 inputs and filters, titled
  # "16 inputs x 16 filters": channels pruned past 16 never showed.
  kernel = np.random.default_rng(0).normal(size=(3, 3, 32, 32)).astype(
      np.float32)
  kernel[:, :, [3, 20, 27], :] = 0
  kernel[:, :, :, 30] = 0
  fig = plots.conv_filters_figure({"conv": {"kernel": kernel}})
  ax = fig.axes[0]
  assert ax.get_title() == ("conv/kernel: all 32 inputs x 32 filters (3x3); "
                            "pruned (red): 3 inputs, 1 filters")
  image = ax.get_images()[0].get_array()
  assert image.shape == (32 * 4 - 1, 32 * 4 - 1)
  # Input 20's row of kernels is there, and zero.
  np.testing.assert_array_equal(image[20 * 4:20 * 4 + 3], 0)
  np.testing.assert_array_equal(image[31 * 4:31 * 4 + 3, :3],
                                kernel[:, :, 31, 0])
  marks = [line.get_ydata()[0] for line in ax.get_lines()
           if line.get_marker() == ">"]
  assert marks == [3 * 4 + 1, 20 * 4 + 1, 27 * 4 + 1]


def test_conv_filters_read_every_layout():
  # Equinox's OIHW and a stack of layers on any axis draw the same grid as
  # the layer's HWIO kernel; a 5-D kernel was taken for a member stack on
  # axis 0, and an OIHW one drawn as HWIO.
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 3, 8, 6)).astype(np.float32)
  kernel[:, :, 2, :] = 0
  want = plots.conv_filters_figure({"conv": {"kernel": kernel}})
  other = rng.normal(size=kernel.shape).astype(np.float32)
  for tree, layout in (
      ({"conv": {"weight": kernel.transpose(3, 2, 0, 1)}}, None),
      ({"conv": {"kernel": np.stack([kernel, other], axis=2)}}, "HWLIO"),
      ({"conv": {"weight": np.stack([kernel.transpose(3, 2, 0, 1),
                                     other.transpose(3, 2, 0, 1)])}},
       "MOIHW")):
    fig = plots.conv_filters_figure(tree, layout=layout)
    np.testing.assert_array_equal(fig.axes[0].get_images()[0].get_array(),
                                  want.axes[0].get_images()[0].get_array())
    assert "pruned (red): 1 inputs, 0 filters" in fig.axes[0].get_title()


_CURVES = """
import sys
from fkjax.workdir import metric_logging
logger = metric_logging.MetricLogger(sys.argv[1])
for epoch in (1, 2, 3):
  logger.write(4 * epoch, {"epoch": epoch, "train_loss": 2.0 / epoch,
                           "train_adv_accuracy": 10.0 * epoch,
                           "val_natural_accuracy": 12.0 * epoch,
                           "weight_sparsity": 5.0 * epoch,
                           "channel_sparsity": 1.0 * epoch})
  print(logger.plot_curves())
logger.close()
import matplotlib
print("matplotlib.pyplot" in sys.modules,
      matplotlib.rcParams._get("backend") is matplotlib.rcsetup._auto_backend_sentinel)
"""


def test_training_curves_are_drawn_every_epoch(tmp_path):
  proc = subprocess.run([sys.executable, "-c", _CURVES, str(tmp_path)],
                        cwd=REPO, capture_output=True, text=True, timeout=120,
                        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  png = tmp_path / "plots" / "training_curves.png"
  assert lines[:3] == [str(png)] * 3
  assert png.read_bytes()[:4] == b"\x89PNG"
  # Nothing global changed: no pyplot, no backend chosen.
  assert lines[3] == "False True"
  assert len(metric_logging.read_metrics(str(tmp_path))) == 3
  assert not [p for p in (tmp_path / "plots").iterdir() if p != png]


def test_an_evaluation_is_in_tensorboard(tmp_path):
  from tests.test_metric_logging import _events, _scalars  # pylint: disable=C0415
  logger = metric_logging.MetricLogger(str(tmp_path))
  logger.write(8, {"epoch": 2, "train_loss": 1.0})
  logger.close()
  logger = metric_logging.MetricLogger(str(tmp_path))
  logger.write_test(4, {"eval_paper/natural_accuracy": 55.0})
  logger.close()
  scalars = {}
  for events in _events(tmp_path / "tensorboard"):
    scalars.update(_scalars(events))
    # An evaluation marks no restart: the later epoch's scalars stay.
    assert not any(e.session_log.status for e in events)
  assert scalars == {(8, "epoch"): 2.0, (8, "train_loss"): 1.0,
                     (4, "eval_paper/natural_accuracy"): 55.0}
