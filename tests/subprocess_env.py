"""The environment of the tests' training subprocesses."""
import os


def subprocess_env(cache_dir=None, devices=1):
  """``devices`` host CPU devices, every compilation cached in ``cache_dir``
  (None leaves the compilation cache to the config), unbuffered output."""
  env = dict(os.environ)
  env.update({
      "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
      "PYTHONUNBUFFERED": "1",
  })
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if cache_dir is not None:
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
  return env
