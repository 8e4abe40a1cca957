"""Trains an fkjax model: PGD adversarial training with sparsification.

  python train.py --config=configs/default.py --workdir=workdirs/en2resnet20
  python train.py --config=configs/default.py:en5resnet20,rgsm \
      --config.sparsity.lamb1=0.1 --workdir=workdirs/en5_rgsm

Running the same command again resumes from the last checkpoint.
"""
from absl import app
from absl import logging
from absl import flags
from ml_collections import config_flags

from fkjax import kernels
from fkjax import parallel

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
flags.DEFINE_string("coordinator_address", None,
                    "Multi-host: host:port of process 0 (jax.distributed).")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's id.")
flags.DEFINE_bool("distributed", False,
                  "Multi-host on a cluster JAX auto-detects (SLURM, TPU pods): "
                  "jax.distributed.initialize() with no arguments.")
config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/default.py[:presets].",
    lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  kernels.apply_xla_flags()  # before JAX starts its backend
  # orbax logs every file it writes at INFO; fkjax prints its own progress.
  logging.set_verbosity(logging.WARNING)
  parallel.initialize_distributed(FLAGS.coordinator_address,
                                  FLAGS.num_processes, FLAGS.process_id,
                                  auto=FLAGS.distributed)
  from fkjax import train  # after jax.distributed.initialize
  train.enable_compilation_cache(FLAGS.config)
  train.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
