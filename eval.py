"""Evaluates a trained fkjax checkpoint: A1..A5, sparsity, plots.

  python eval.py --config=configs/default.py --workdir=workdirs/en2resnet20
  python eval.py --config=configs/default.py --workdir=... \
      --config.eval.attacks=natural,ifgsm20 --config.eval.eot_samples=10

Use the config the model was trained with (the same presets and model
overrides); writes <workdir>/eval.json and <workdir>/plots/*.png.
"""
from absl import app
from absl import logging
from absl import flags
from ml_collections import config_flags

from fkjax import kernels

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory that train.py wrote.")
config_flags.DEFINE_config_file(
    "config", None, "Config file the model was trained with.",
    lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  kernels.apply_xla_flags()  # before JAX starts its backend
  # orbax logs every file it writes at INFO; fkjax prints its own progress.
  logging.set_verbosity(logging.WARNING)
  from fkjax import train
  train.enable_compilation_cache(FLAGS.config)
  train.evaluate_checkpoint(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
