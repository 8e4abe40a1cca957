"""Trains each run of a sweep alone, from the run's own config.json.

``python -m tests.sweep_singles OUT RUN_WORKDIR...`` trains every run with
``train.train_and_evaluate`` into ``OUT/<run name>``: what the sweep's runs
must equal.
"""
import os
import sys

from fkjax import kernels
from fkjax.config import record as run_config
from fkjax.training import devices
from fkjax.training import train


def main():
  kernels.apply_xla_flags()
  out, workdirs = sys.argv[1], sys.argv[2:]
  for workdir in workdirs:
    config = run_config.config_for_eval(workdir, None, {}, False)
    # The sweep of the tests swings model.noise_coef, which runs the jnp
    # noise; the fused CPU kernel rounds differently (on some CPUs enough
    # to flip a PGD sign step within two steps), so the runs alone use the
    # jnp noise too: what is compared is the sweep, not the two kernels.
    config.kernels.noise = "jnp"
    devices.enable_compilation_cache(config)
    train.train_and_evaluate(
        config, os.path.join(out, os.path.basename(os.path.normpath(workdir))))


if __name__ == "__main__":
  main()
