"""fkjax._xla_flags: the XLA flags fkjax sets unless the user has."""
import os

from fkjax import _xla_flags


def test_defaults_added_and_user_flags_win(monkeypatch):
  monkeypatch.delenv("FKJAX_NO_XLA_FLAGS", raising=False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type= "
                     "--xla_force_host_platform_device_count=2")
  _xla_flags.apply_default_flags()
  flags = os.environ["XLA_FLAGS"].split()
  assert "--xla_cpu_experimental_ynn_fusion_type=" in flags
  assert not any(f.endswith("ynn_fusion_type=reduce") for f in flags)
  assert ("--xla_cpu_enable_concurrency_optimized_scheduler=false" in flags)
  assert "--xla_force_host_platform_device_count=2" in flags


def test_opt_out(monkeypatch):
  monkeypatch.setenv("FKJAX_NO_XLA_FLAGS", "1")
  monkeypatch.setenv("XLA_FLAGS", "")
  _xla_flags.apply_default_flags()
  assert os.environ["XLA_FLAGS"] == ""


def test_this_process_runs_with_the_defaults():
  # Importing fkjax (above) set them before JAX's backend started, and XLA
  # accepted them: it aborts the process on a flag it does not know.
  import jax  # pylint: disable=import-outside-toplevel
  assert float(jax.numpy.ones(3).sum()) == 3.0
  if not os.environ.get("FKJAX_NO_XLA_FLAGS"):
    for name in _xla_flags.DEFAULT_CPU_FLAGS:
      assert name in os.environ["XLA_FLAGS"]
