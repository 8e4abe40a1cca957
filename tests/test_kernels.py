"""fkjax.kernels.resolve and the layering: models below, no import effects."""
import ast
import json
import os
import pathlib
import subprocess
import sys

import jax
import ml_collections
import pytest
from jax import lax

from fkjax import kernels
from fkjax import models
from fkjax.kernels import selection
from fkjax.kernels.cpu import build
from fkjax.kernels.cpu import explicit_grad_conv
from fkjax.kernels.cpu import noise_cpu
from fkjax.kernels.cpu import onednn_conv
from fkjax.kernels.cpu import threefry
from fkjax.models import ensemble
from fkjax.slim import model as slim_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ROOT / "fkjax" / "models"


def _auto(**overrides):
  return ml_collections.ConfigDict(
      {"conv": "auto", "noise": "auto", "member_execution": "auto",
       **overrides})


def test_auto_on_this_cpu_takes_the_library_where_it_builds():
  if jax.default_backend() != "cpu":
    pytest.skip("a CPU backend's resolution")
  library = build.unavailable_reason() is None
  k = kernels.resolve(_auto(), ensemble_size=2)
  assert k.conv is (onednn_conv.conv_general_dilated if library
                    else explicit_grad_conv.conv_general_dilated)
  assert k.inject_noise is (noise_cpu.inject_noise if library
                            else threefry.inject_noise)
  assert k.platform == "cpu"
  # A sweep's traced coefficient takes the jnp form of the fused kernel.
  assert k.noise_any_coef is threefry.inject_noise
  assert k.member_execution == "unrolled"
  assert dict(k.names) == {
      "conv": "onednn" if library else "explicit_grad",
      "noise": "fused" if library else "jnp", "member_execution": "unrolled"}
  assert k.description == (f"conv {k.names['conv']}, noise "
                           f"{k.names['noise']}, members unrolled")
  assert k.model_kwargs == {"conv": k.conv, "inject_noise": k.inject_noise,
                            "member_execution": "unrolled"}


def test_member_execution_by_backend_and_ensemble_size():
  many = kernels.MAX_UNROLLED_MEMBERS + 1
  cpu = lambda n: kernels.resolve(_auto(), ensemble_size=n, backend="cpu")
  assert cpu(kernels.MAX_UNROLLED_MEMBERS).member_execution == "unrolled"
  assert cpu(many).member_execution == "sequential"
  gpu = kernels.resolve(_auto(), ensemble_size=many, backend="gpu")
  assert gpu.member_execution == "batched"
  assert kernels.resolve(_auto(member_execution="batched"), ensemble_size=2,
                         backend="cpu").member_execution == "batched"


@pytest.mark.parametrize("backend", ["gpu", "cuda", "rocm", "tpu"])
def test_accelerators_take_the_models_own_convolution_and_noise(backend):
  k = kernels.resolve(None, ensemble_size=2, backend=backend)  # all "auto"
  assert k.conv is lax.conv_general_dilated
  assert k.inject_noise is models.inject_noise
  assert k.noise_any_coef is models.inject_noise
  assert dict(k.names) == {"conv": "xla", "noise": "model",
                           "member_execution": "batched"}
  assert k.platform == ("tpu" if backend == "tpu" else "gpu")
  # Plain ResNets without noise say only what they use.
  assert kernels.resolve(None, noise=False, backend=backend).description == (
      "conv xla")


def test_a_platform_choice_never_changes_another_platforms():
  # The same config, resolved for each platform: a CPU keeps its kernels,
  # an accelerator its stock programs; choices valid everywhere stay.
  chosen = _auto(conv="xla", noise="model", member_execution="sequential")
  for backend in ("cpu", "gpu", "tpu"):
    k = kernels.resolve(chosen, ensemble_size=2, backend=backend)
    assert dict(k.names) == {"conv": "xla", "noise": "model",
                             "member_execution": "sequential"}
  cpu = kernels.resolve(_auto(), ensemble_size=2, backend="cpu")
  assert cpu.names["conv"] in ("onednn", "explicit_grad")
  assert cpu.names["noise"] in ("fused", "jnp")


def test_the_platform_can_be_forced_to_an_accelerators(monkeypatch):
  if jax.default_backend() != "cpu":
    pytest.skip("forcing a GPU's selections on a CPU")
  monkeypatch.setenv(kernels.PLATFORM_ENV, "gpu")
  assert kernels.platform() == "gpu"
  k = kernels.resolve(None, ensemble_size=2)
  assert dict(k.names) == {"conv": "xla", "noise": "model",
                           "member_execution": "batched"}
  # An explicit backend still wins over the environment.
  assert kernels.resolve(None, backend="cpu").platform == "cpu"
  monkeypatch.setenv(kernels.PLATFORM_ENV, "TPU")
  assert kernels.platform() == "tpu"
  monkeypatch.setenv(kernels.PLATFORM_ENV, "metal")
  with pytest.raises(ValueError, match="FKJAX_KERNELS_PLATFORM='metal'"):
    kernels.resolve(None)
  monkeypatch.delenv(kernels.PLATFORM_ENV)
  assert kernels.platform() == "cpu"


def test_explicit_choices_and_errors():
  k = kernels.resolve(_auto(conv="xla", noise="jnp"), backend="cpu")
  assert k.conv is lax.conv_general_dilated
  assert k.inject_noise is threefry.inject_noise
  with pytest.raises(ValueError, match="kernels.conv must be"):
    kernels.resolve(_auto(conv="fft"), backend="cpu")
  with pytest.raises(ValueError, match="kernels.noise must be"):
    kernels.resolve(_auto(noise="fast"), backend="cpu")
  with pytest.raises(ValueError, match="unknown config.kernels keys"):
    kernels.resolve({"noise_impl": "jnp"}, backend="cpu")
  for key, value in (("conv", "onednn"), ("conv", "explicit_grad"),
                     ("noise", "fused"), ("noise", "jnp")):
    for backend in ("gpu", "tpu"):
      with pytest.raises(ValueError, match="CPUs only"):
        kernels.resolve({key: value}, backend=backend)


def test_asking_for_the_library_where_it_does_not_build(tmp_path,
                                                        monkeypatch):
  monkeypatch.setenv("FKJAX_ONEDNN_ROOT", str(tmp_path))  # no oneDNN there
  monkeypatch.setattr(build, "load", build.load.__wrapped__)  # not cached
  monkeypatch.setattr(build, "unavailable_reason",
                      build.unavailable_reason.__wrapped__)
  with pytest.raises(kernels.OneDnnUnavailable, match="no oneDNN"):
    kernels.resolve({"conv": "onednn"}, backend="cpu")
  # "auto" falls back, with a warning that says why.
  monkeypatch.setattr(kernels.selection, "_warn_fallback",
                      kernels.selection._warn_fallback.__wrapped__)  # pylint: disable=protected-access
  with pytest.warns(RuntimeWarning, match="falls back.*no oneDNN"):
    k = kernels.resolve(None, backend="cpu")
  # An accelerator's selections never build or ask for the CPU library.
  assert kernels.resolve(None, backend="gpu").names["conv"] == "xla"
  assert dict(k.names) == {"conv": "explicit_grad", "noise": "jnp",
                           "member_execution": "unrolled"}


def test_the_default_config_resolves():
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  assert dict(config.kernels) == {"conv": "auto", "noise": "auto",
                                  "member_execution": "auto"}
  assert not {"conv", "noise_impl", "member_execution"} & set(config.model)
  kernels.resolve(config.kernels, ensemble_size=2)


# --------------------------------------------------------------------------
# Layering: the models know nothing of the kernels.


def _model_files():
  files = sorted(MODELS.glob("*.py"))
  assert files
  return files


def test_models_mention_no_kernel():
  # grep -R "onednn\|xla_flags\|noise_inject" fkjax/models (bytecode aside)
  files = [p for p in MODELS.rglob("*")
           if p.is_file() and "__pycache__" not in p.parts]
  assert len(files) >= 3
  for path in files:
    text = path.read_text()
    for word in ("onednn", "xla_flags", "noise_inject"):
      assert word not in text, f"{path.name} mentions {word}"


def test_models_import_nothing_else_from_fkjax():
  for path in _model_files():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""]
      else:
        continue
      for name in names:
        if name == "fkjax" or name.startswith("fkjax."):
          assert name.startswith("fkjax.models"), f"{path.name}: {name}"


def test_kernels_take_only_the_member_executions_and_noise_from_the_models():
  # The models are the bottom layer; the kernels know no model, only the
  # one list of how an ensemble's members may run and the one noise draw
  # (which the CPU's jnp form runs with its hash written out).
  paths = sorted((ROOT / "fkjax" / "kernels").rglob("*.py"))
  assert any(p.parent.name == "cpu" for p in paths)
  imported = set()
  for path in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        assert not any(alias.name.startswith("fkjax.models")
                       for alias in node.names), path.name
      elif (isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("fkjax.models")):
        assert node.module == "fkjax.models", path.name
        imported |= {a.name for a in node.names}
  assert imported == {"MEMBER_EXECUTIONS", "inject_noise", "noise"}


def test_member_executions_are_defined_once():
  assert selection.MEMBER_EXECUTIONS is ensemble.MEMBER_EXECUTIONS
  assert slim_model.MEMBER_EXECUTIONS is ensemble.MEMBER_EXECUTIONS
  assert selection.CHOICES["member_execution"] is ensemble.MEMBER_EXECUTIONS
  # grep: one assignment in the package.
  assigned = [path.name for path in sorted((ROOT / "fkjax").rglob("*.py"))
              if "\nMEMBER_EXECUTIONS = " in path.read_text()]
  assert assigned == ["ensemble.py"]


# --------------------------------------------------------------------------
# No global side effects on import.

_IMPORTS = """
import json, logging, os, sys
import jax, matplotlib
config_before = {k: repr(v) for k, v in jax.config.values.items()}
backend_before = dict.__getitem__(matplotlib.rcParams, "backend")
def log_setup():
  return {name: (len(logger.filters), len(logger.handlers), logger.level)
          for name, logger in [("", logging.getLogger())] + [
              (n, logging.getLogger(n)) for n in ("absl", "jax", "orbax")]}
# orbax adds a handler to the root logger when imported; fkjax must not
# add more.
import orbax.checkpoint
logging_before = log_setup()
import fkjax, fkjax.sparsity, fkjax.training.train, fkjax.evaluation, fkjax.evaluation.plots
import fkjax.kernels, fkjax.models, fkjax.checkpoint
import reproduce.figures, reproduce.report
from fkjax import sparsity
changed = sorted(k for k, v in jax.config.values.items()
                 if config_before.get(k) != repr(v))
print(json.dumps({
    "xla_flags": os.environ.get("XLA_FLAGS"),
    "jax_config_changed": changed,
    "matplotlib_backend_changed":
        dict.__getitem__(matplotlib.rcParams, "backend") != backend_before,
    "pyplot_imported": "matplotlib.pyplot" in sys.modules,
    "backends_started": __import__("jax._src.xla_bridge").
        _src.xla_bridge.backends_are_initialized(),
    "logging_changed": log_setup() != logging_before,
}))
"""


def _clean_env(**extra):
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "FKJAX_NO_XLA_FLAGS", "MPLBACKEND")}
  env["PYTHONPATH"] = str(ROOT)
  env.update(extra)
  return env


def test_importing_fkjax_changes_nothing_global():
  out = subprocess.run([sys.executable, "-c", _IMPORTS], env=_clean_env(),
                       cwd=ROOT, capture_output=True, text=True, check=True)
  state = json.loads(out.stdout.strip().splitlines()[-1])
  assert state == {"xla_flags": None, "jax_config_changed": [],
                   "matplotlib_backend_changed": False,
                   "pyplot_imported": False, "backends_started": False,
                   "logging_changed": False}
