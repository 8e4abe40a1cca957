"""fkjax.kernels.apply_xla_flags: fkjax's CPU flags, only where they apply."""
import os
import pathlib
import subprocess
import sys

import pytest

from fkjax.kernels.cpu import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULTS = [f"{k}={v}" for k, v in xla_flags.DEFAULT_CPU_FLAGS.items()]


@pytest.fixture(name="fresh")
def _fresh(monkeypatch):
  """A process state in which the flags would be set: CPU, backend not
  started, no user flags."""
  for name in ("FKJAX_NO_XLA_FLAGS", "XLA_FLAGS", "JAX_PLATFORMS"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(xla_flags, "_backends_started", lambda: False)
  monkeypatch.setattr(xla_flags, "accelerator_plugin_installed",
                      lambda: False)
  # As before JAX's import: the platforms come from the environment.
  monkeypatch.setattr(xla_flags, "_configured_platforms",
                      lambda: os.environ.get("JAX_PLATFORMS", ""))
  return monkeypatch


def test_the_installed_jaxlib_knows_the_defaults():
  names = tuple(k.lstrip("-") for k in xla_flags.DEFAULT_CPU_FLAGS)
  assert xla_flags.known_to_jaxlib(names) == frozenset(names)
  assert not xla_flags.known_to_jaxlib(("xla_cpu_no_such_flag_in_any_xla",))
  # A flag's name is matched whole, not as the start of a longer one.
  assert not xla_flags.known_to_jaxlib(("xla_cpu_enable_concurrency",))


def test_defaults_added_and_user_flags_win(fresh):
  fresh.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type= "
               "--xla_force_host_platform_device_count=2")
  added = xla_flags.apply_xla_flags()
  assert added == ["--xla_cpu_enable_concurrency_optimized_scheduler=false"]
  flags = os.environ["XLA_FLAGS"].split()
  assert "--xla_cpu_experimental_ynn_fusion_type=" in flags
  assert not any(f.endswith("ynn_fusion_type=reduce") for f in flags)
  assert "--xla_force_host_platform_device_count=2" in flags
  assert xla_flags.apply_xla_flags() == []   # nothing left to add


def test_opt_out(fresh):
  fresh.setenv("FKJAX_NO_XLA_FLAGS", "1")
  assert xla_flags.apply_xla_flags() == []
  assert "XLA_FLAGS" not in os.environ


def test_flags_unknown_to_jaxlib_are_never_set(fresh, tmp_path):
  library = tmp_path / "libfake.so"
  library.write_bytes(b"\0xla_cpu_enable_concurrency_optimized_scheduler\0")
  fresh.setattr(xla_flags, "jaxlib_libraries", lambda: [library])
  xla_flags.known_to_jaxlib.cache_clear()
  try:
    assert xla_flags.apply_xla_flags() == [
        "--xla_cpu_enable_concurrency_optimized_scheduler=false"]
  finally:
    xla_flags.known_to_jaxlib.cache_clear()
  assert "ynn" not in os.environ["XLA_FLAGS"]


@pytest.mark.parametrize("platforms,cpu", [
    ("cpu", True), ("cuda", False), ("tpu,cpu", False), (" CPU ,cuda", True)])
def test_only_for_a_cpu_backend(fresh, platforms, cpu):
  fresh.setenv("JAX_PLATFORMS", platforms)
  assert xla_flags.cpu_backend_expected() == cpu
  assert xla_flags.apply_xla_flags() == (DEFAULTS if cpu else [])


def test_an_accelerator_plugin_means_no_cpu_flags(fresh):
  fresh.setattr(xla_flags, "accelerator_plugin_installed", lambda: True)
  assert xla_flags.apply_xla_flags() == []
  fresh.setenv("JAX_PLATFORMS", "cpu")   # unless the CPU is asked for
  assert xla_flags.apply_xla_flags() == DEFAULTS


def test_too_late_after_the_backend_started(fresh):
  fresh.setattr(xla_flags, "_backends_started", lambda: True)
  with pytest.warns(RuntimeWarning, match="after JAX started"):
    assert xla_flags.apply_xla_flags() == []
  assert "XLA_FLAGS" not in os.environ


def test_xla_accepts_the_flags_in_a_fresh_process():
  # XLA aborts the process on a flag it does not know.
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "FKJAX_NO_XLA_FLAGS")}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  code = ("import os; from fkjax import kernels; "
          "added = kernels.apply_xla_flags(); import jax; "
          "assert float(jax.numpy.ones(3).sum()) == 3.0; "
          "print(added, os.environ['XLA_FLAGS'])")
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                       capture_output=True, text=True, check=True)
  for flag in DEFAULTS:
    assert flag in out.stdout


def test_a_plugin_in_jaxs_plugin_namespace_is_found(tmp_path, monkeypatch):
  (tmp_path / "jax_plugins").mkdir()
  (tmp_path / "jax_plugins" / "fake_gpu_plugin.py").write_text("")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert xla_flags.accelerator_plugin_installed()


@pytest.mark.parametrize("module,runs,argv", [
    ("reproduce.__main__", "reproduce.runner.execute",
     ["table5", "--scale=tiny", "--seeds=1", "--rows=resnet20_noskip"]),
    ("reproduce.pilot", "reproduce.pilot.run",
     ["rgsm_m8"]),
])
def test_the_reproduction_runners_set_the_flags_before_a_run(
    tmp_path, module, runs, argv):
  # They train and attack in their own process, as train.py does: the flags
  # must be in XLA_FLAGS when the first run starts JAX's backend.
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "FKJAX_NO_XLA_FLAGS")}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  owner, name = runs.rsplit(".", 1)
  code = (
      "import importlib, os, sys\n"
      f"owner = importlib.import_module({owner!r})\n"
      "def first_run(*args, **kwargs):\n"
      "  print('XLA_FLAGS at the first run:', os.environ.get('XLA_FLAGS'))\n"
      "  sys.exit(0)\n"
      f"setattr(owner, {name!r}, first_run)\n"
      f"importlib.import_module({module!r}).main({argv!r} + sys.argv[1:])\n")
  out = subprocess.run(
      [sys.executable, "-c", code, f"--root={tmp_path / 'w'}",
       f"--results={tmp_path / 'r'}"], env=env, cwd=ROOT,
      capture_output=True, text=True, check=True)
  assert "XLA_FLAGS at the first run:" in out.stdout, out.stderr
  for flag in DEFAULTS:
    assert flag in out.stdout
  assert "after JAX started" not in out.stderr
