"""What the tests rely on holds however the test run was started.

A run started in the background, with SIGINT ignored, still interrupts its
children; the tests compile into their own cache, never the user's; what a
test reads from a program comes from its operations, not from its text.
"""
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp

from configs import default
from fkjax.training import devices
from tests import hlo
from tests.subprocess_env import TEST_CACHE_DIR
from tests.subprocess_env import TIMEOUT_S
from tests.subprocess_env import subprocess_env

REPO = TEST_CACHE_DIR.parents[1]

# A test process (tests/conftest.py loaded) started as `cmd &` leaves it:
# SIGINT ignored. It starts a child and prints how the child takes SIGINT.
_STARTED_IN_THE_BACKGROUND = """
import signal, subprocess, sys
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
import tests.conftest
print(subprocess.run([sys.executable, "-c", "import signal; print("
    "signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
    capture_output=True, text=True, check=True).stdout.strip())
"""


def test_a_run_started_with_sigint_ignored_still_interrupts_its_children():
  # Without tests/conftest.py's reset, the child ignores Ctrl-C: the tests
  # that interrupt a child waited for it until their timeout.
  proc = subprocess.run(
      [sys.executable, "-c", _STARTED_IN_THE_BACKGROUND], cwd=REPO,
      env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
      text=True, timeout=TIMEOUT_S,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "True"


def test_the_tests_compile_into_their_own_cache_not_the_users():
  # The default config's cache (~/.cache/fkjax) is left alone, in this
  # process and in the children of tests.subprocess_env.
  assert jax.config.jax_compilation_cache_dir == str(TEST_CACHE_DIR)
  assert subprocess_env()["JAX_COMPILATION_CACHE_DIR"] == str(TEST_CACHE_DIR)
  assert devices.enable_compilation_cache(default.get_config()) == str(
      TEST_CACHE_DIR)


def callback_in_the_name(x):
  return jnp.sin(x) * 2


def with_a_host_callback(x):
  jax.debug.callback(lambda v: None, x)
  return jnp.sin(x) * 2


def test_a_programs_callbacks_are_its_custom_calls_not_its_names():
  x = jnp.ones((3,))
  plain = jax.jit(callback_in_the_name).lower(x)
  calling = jax.jit(with_a_host_callback).lower(x)
  # The text names the function (its metadata, a cached program's other
  # names): a substring test would see a callback.
  assert "callback" in plain.compile().as_text()
  for program in (plain, plain.compile()):
    assert not hlo.host_callbacks(program)
    assert not hlo.custom_call_targets(program)
  for program in (calling, calling.compile()):
    assert len(hlo.host_callbacks(program)) == 1
  assert hlo.operations(plain)["stablehlo.sine"] == 1
  assert hlo.operations(plain.compile())["sin"] >= 1
  assert hlo.primitives(jax.make_jaxpr(with_a_host_callback)(x))[
      "debug_callback"] == 1
