"""Shared test settings."""
import os
import signal

import jax
import pytest

from fkjax import kernels
from tests import tiny_run as tiny_run_lib
from tests.subprocess_env import FAST_COMPILE_FLAGS
from tests.subprocess_env import TEST_CACHE_DIR

os.environ["XLA_FLAGS"] = " ".join(
    filter(None, [os.environ.get("XLA_FLAGS"), FAST_COMPILE_FLAGS]))

# fkjax's CPU XLA flags, as train.py sets them, before a test starts JAX's
# backend (without them XLA:CPU runs some convolution gradients ~11x slower).
kernels.apply_xla_flags()

# The tests compare values to float32 tolerances. On GPUs JAX's default
# matmul/conv precision is TF32 (10-bit mantissa), which misses them (5 model
# and attack tests failed on an H200 with it, all passed with "highest");
# on CPUs this setting changes nothing. It reaches only the tests that call
# models and attacks directly: a run's programs (the model Experiment builds,
# the training step) trace under config.precision's own precision, which
# overrides this default, so what a GPU run computes is what the tests check
# (tests/test_precision.py lowers each precision under another default).
jax.config.update("jax_default_matmul_precision", "highest")

# One persistent compilation cache for the test processes of this checkout
# (both xdist workers, later runs) and the children started with
# tests.subprocess_env, never the user's: a program a test compiled is
# loaded by the next test that compiles it. Set before anything compiles;
# an in-process run's own cache setting (devices.enable_compilation_cache)
# then leaves it alone. Not exported to every child: a child may write
# under a file-size limit, or be told --config.compilation_cache_dir=.
jax.config.update("jax_compilation_cache_dir", str(TEST_CACHE_DIR))

# A test run started in the background (`cmd &` in a script) inherits
# SIGINT ignored, and so would every child a test starts: Python keeps an
# ignored SIGINT ignored, and a child sent Ctrl-C would run on. Python's own
# handler here is reset to the default in every child at exec, where Python
# installs its KeyboardInterrupt again, as in a run started from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
  """A finished tiny train.py run shared by the session's test files (see
  tests/tiny_run.py): copy it before writing to it."""
  return tiny_run_lib.train_once(
      tiny_run_lib.shared_root(tmp_path_factory.getbasetemp()))
