"""The environment of the tests' training subprocesses."""
import os
from pathlib import Path

# The tests' own persistent compilation cache, one per checkout (ignored by
# git), shared by the test processes and their subprocesses: a program is
# compiled once, by whichever test needs it first, and loaded by every later
# one, in this run and the next. Never the user's cache (configs/default.py:
# ~/.cache/fkjax), whose programs come from other code.
TEST_CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "tests"

# Test-only: XLA:CPU's code generation at its lowest optimisation, and its
# older elemental emitters instead of the fusion emitters (which compile
# each fusion through MLIR first). The tests' programs are small and most
# compile once, so compiling is most of their time (tests/test_models.py on
# 2 AVX2 cores: 123 s with XLA's default, 53 s with the first two flags;
# again later, beside a training run: 66 s with those two, 37 s with the
# third added); what they compare is computed under the same flags on both
# sides. train.py, eval.py and the runner never set them
# (docs/performance.md: the third is no gain there).
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false")

# The longest a test waits on a child: a child running longer hangs. No
# test's child takes a tenth of it, on a machine however busy, so no working
# test fails on a slow machine (wall time on a loaded machine is many times
# the CPU time).
TIMEOUT_S = 3600

# ``python -c FILE_SIZE_LIMIT script.py args...`` runs ``script.py`` with
# files above 64 KiB failing to write (EFBIG), as they do on a full disk.
FILE_SIZE_LIMIT = (
    "import resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, "
    "resource.RLIM_INFINITY))\n"
    "sys.argv = sys.argv[1:]\n"
    "import runpy; runpy.run_path(sys.argv[0], run_name='__main__')\n")


def subprocess_env(cache_dir=TEST_CACHE_DIR, devices=1):
  """``devices`` host CPU devices, every compilation cached in ``cache_dir``
  (None leaves the compilation cache to the config), unbuffered output."""
  env = dict(os.environ)
  env.update({
      "XLA_FLAGS": (f"--xla_force_host_platform_device_count={devices} "
                    f"{FAST_COMPILE_FLAGS}"),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
      "PYTHONUNBUFFERED": "1",
  })
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if cache_dir is not None:
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
  return env
