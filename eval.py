"""Evaluates a trained fkjax run: A1..A5 of its best checkpoint, sparsity.

  python eval.py --workdir=workdirs/en2resnet20
  python eval.py --workdir=workdirs/en2resnet20 \
      --config.eval.attacks=natural,ifgsm20 --config.eval.eot_samples=10

The run's own ``<workdir>/config.json`` says what is evaluated: no
``--config`` is needed, and ``--config.KEY=VALUE`` may only change how it is
evaluated (``config.eval.*``, ``config.kernels.*``, data location, devices,
progress). Results go to ``<workdir>/eval_<protocol>[_eot<K>].json`` and
``<workdir>/plots/*.png``.
"""
# First, before the imports below (seconds): Ctrl-C, or a missing package of
# the [train] extra, during them is one line (fkjax.entry).
from fkjax import entry
if __name__ == "__main__":
  entry.start()
# pylint: disable=wrong-import-position

import os

from absl import flags

from fkjax import cli
from fkjax import oserrors

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory that train.py wrote.")
cli.define_config_file(
    "config", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "configs", "default.py"),
    "Optional: the config file the run was trained with (checked against "
    "the run's config.json). --config.eval.* overrides work without it.",
    lock_config=False)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  config = cli.run_config_for_eval(argv, FLAGS.workdir, FLAGS["config"])
  from fkjax import checkpoint  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import run as eval_run  # pylint: disable=import-outside-toplevel
  from fkjax.training import devices  # pylint: disable=import-outside-toplevel
  from fkjax import workdir  # pylint: disable=import-outside-toplevel
  # Before the lock, whose file would otherwise be left in a directory that
  # holds no run to evaluate.
  checkpoint.require_checkpoints(FLAGS.workdir)
  # Its results go there: checked before the attacks run.
  oserrors.declare("--workdir", FLAGS.workdir, write=True)
  oserrors.declare("--config.dataset.data_dir", config.dataset.data_dir)
  devices.enable_compilation_cache(config)
  # Evaluations may run side by side, but not while train.py writes.
  with workdir.WorkdirLock(FLAGS.workdir, shared=True):
    eval_run.evaluate_checkpoint(config, FLAGS.workdir)


if __name__ == "__main__":
  cli.run(main)
