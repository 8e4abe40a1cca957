"""Shared test settings."""
import os

import jax

from fkjax import kernels
from tests.subprocess_env import FAST_COMPILE_FLAGS

os.environ["XLA_FLAGS"] = " ".join(
    filter(None, [os.environ.get("XLA_FLAGS"), FAST_COMPILE_FLAGS]))

# fkjax's CPU XLA flags, as train.py sets them, before a test starts JAX's
# backend (without them XLA:CPU runs some convolution gradients ~11x slower).
kernels.apply_xla_flags()

# The tests compare values to float32 tolerances. On GPUs JAX's default
# matmul/conv precision is TF32 (10-bit mantissa), which misses them (5 model
# and attack tests failed on an H200 with it, all passed with "highest");
# on CPUs this setting changes nothing.
jax.config.update("jax_default_matmul_precision", "highest")


# The slowest files first (measured with --durations on 2 cores): under
# pytest-xdist's --dist loadfile a file runs whole on one worker, and a slow
# file started last leaves the other worker idle while it runs. xdist keeps
# this order with --no-loadscope-reorder (README's command); by default it
# starts the files with the most tests first, and test_train.py has few.
_SLOWEST_FIRST = ("test_train.py", "test_reproduce.py", "test_sweep.py",
                  "test_models.py", "test_sanity.py", "test_kernels_noise.py",
                  "test_slim.py", "test_kernels_conv.py",
                  "test_eval_journal.py", "test_protocol.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
