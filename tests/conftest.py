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
# on CPUs this setting changes nothing. It reaches only the tests that call
# models and attacks directly: a run's programs (the model Experiment builds,
# the training step) trace under config.precision's own precision, which
# overrides this default, so what a GPU run computes is what the tests check
# (tests/test_precision.py lowers each precision under another default).
jax.config.update("jax_default_matmul_precision", "highest")
