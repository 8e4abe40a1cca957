"""Trains an fkjax model: PGD adversarial training with sparsification.

  python train.py --config=configs/default.py --workdir=workdirs/en2resnet20
  python train.py --config=configs/default.py:en5resnet20,rgsm \
      --config.sparsity.lamb1=0.1 --workdir=workdirs/en5_rgsm

Running the same command again resumes from the last checkpoint. A config
with a ``sweep`` section (``configs/sweep.py``) trains its runs as one
program, each in ``<workdir>/<run name>/`` (docs/sweeps.md). A mistake
(bad config value, missing data, a workdir of another run) ends in one line
``error: ...``; ``--traceback`` shows the traceback.
"""
# First, before the imports below (seconds): Ctrl-C, or a missing package of
# the [train] extra, during them is one line (fkjax.entry).
from fkjax import entry
if __name__ == "__main__":
  entry.start()
# pylint: disable=wrong-import-position

from absl import flags
from absl import logging
from ml_collections import config_flags

from fkjax import cli
from fkjax import oserrors

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
    cli.fail(f"unexpected arguments: {argv[1:]} (flags take the form "
             "--name=value)", code=2)
  # Before anything is loaded or compiled: a bad value fails in a second.
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  from fkjax import workdir  # pylint: disable=import-outside-toplevel
  config = cli.loaded_config(FLAGS.config)
  run_config.validate(config)
  workdir.check_workdir(FLAGS.workdir)
  # Before any work that a folder it cannot write would throw away.
  oserrors.declare("--workdir", FLAGS.workdir, write=True,
                   folders=("checkpoints",))
  oserrors.declare("--config.dataset.data_dir", config.dataset.data_dir)
  from fkjax import kernels  # pylint: disable=import-outside-toplevel
  kernels.apply_xla_flags()  # before JAX starts its backend
  # orbax logs every file it writes at INFO; fkjax prints its own progress.
  logging.set_verbosity(logging.WARNING)
  from fkjax.training import parallel  # pylint: disable=import-outside-toplevel
  parallel.initialize_distributed(FLAGS.coordinator_address,
                                  FLAGS.num_processes, FLAGS.process_id,
                                  auto=FLAGS.distributed)
  # after jax.distributed.initialize
  from fkjax.training import devices  # pylint: disable=import-outside-toplevel
  from fkjax.training import train  # pylint: disable=import-outside-toplevel
  devices.enable_compilation_cache(config)
  if config.get("sweep") is not None:
    from fkjax.training import sweep  # pylint: disable=import-outside-toplevel
    sweep.train_from_config(config, FLAGS.workdir)
  else:
    train.train_and_evaluate(config, FLAGS.workdir)


if __name__ == "__main__":
  cli.run(main)
