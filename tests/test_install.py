"""``pip install fkjax`` is the library; ``fkjax[train]`` adds the training
side.

The library's subpackages (sparsifiers, models, attacks, slimming,
checkpoints, kernels) import nothing that only the ``[train]`` extra
installs: checked here from the modules they load, and in a fresh virtual
environment from the built wheel (slow set).
"""
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
import pytest

from tests.subprocess_env import TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("fkjax.sparsity", "fkjax.attacks", "fkjax.models", "fkjax.slim",
           "fkjax.checkpoint", "fkjax.kernels")
# What the extra is for: each of these is only in [train].
TRAIN_ONLY = ("ml-collections", "tqdm", "tensorboardx", "matplotlib")


def _project():
  return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _closure(requirements) -> set[str]:
  """The distributions ``requirements`` install, as this environment's
  metadata says (markers evaluated, extras followed)."""
  seen, todo = set(), [Requirement(r) for r in requirements]
  while todo:
    req = todo.pop()
    key = (canonicalize_name(req.name), frozenset(req.extras))
    if key in seen:
      continue
    seen.add(key)
    try:
      deps = md.requires(req.name) or []
    except md.PackageNotFoundError:
      continue  # not installed here: nothing of it can be imported either
    for dep in map(Requirement, deps):
      extras = req.extras or {""}
      if dep.marker is None or any(
          dep.marker.evaluate({"extra": e}) for e in extras):
        todo.append(dep)
  return {name for name, _ in seen}


_IMPORTED = """
import importlib, importlib.metadata as md, json, os, sys
before = set(sys.modules)   # the interpreter's own start (.pth hooks)
for name in sys.argv[1:]:
  importlib.import_module(name)
new = [m for n, m in list(sys.modules.items()) if n not in before]
files = {os.path.realpath(m.__file__) for m in new
         if getattr(m, "__file__", None)}
found = set()
for top, dists in md.packages_distributions().items():
  if not any(m.__name__.split(".")[0] == top for m in new):
    continue
  for dist in dists:
    # A namespace package (google.*) has several: the one whose files ran.
    if len(dists) == 1 or files & {
        os.path.realpath(md.distribution(dist).locate_file(f))
        for f in md.distribution(dist).files or ()
        if str(f).startswith(top + "/")}:
      found.add(dist)
print(json.dumps(sorted(found)))
"""


@pytest.mark.slow
def test_the_library_imports_only_its_base_dependencies():
  base = _closure(_project()["dependencies"])
  train = _closure(_project()["optional-dependencies"]["train"]) - base
  assert set(TRAIN_ONLY) <= train
  proc = subprocess.run([sys.executable, "-c", _IMPORTED, *LIBRARY],
                        cwd=REPO, capture_output=True, text=True,
                        timeout=TIMEOUT_S,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
  assert proc.returncode == 0, proc.stderr
  imported = {canonicalize_name(d) for d in json.loads(proc.stdout)}
  assert imported - base - {"fkjax"} == set()
  assert "jax" in imported and "flax" in imported


def test_the_extras_that_run_training_bring_train():
  extras = _project()["optional-dependencies"]
  for name in ("test", "tfds"):
    assert "fkjax[train]" in extras[name]
  # requirements.txt (the README's and CI's environment) pins it all.
  pinned = {canonicalize_name(Requirement(line).name)
            for line in (REPO / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
  wanted = {canonicalize_name(Requirement(r).name)
            for r in _project()["dependencies"] + extras["train"]}
  assert wanted <= pinned


_CHECK = """
import importlib.util, sys
import numpy as np
import fkjax.sparsity, fkjax.attacks, fkjax.models, fkjax.slim
out = fkjax.sparsity.project({"conv": {"kernel": np.ones((3, 3, 2, 2))}},
                             "rvsm", beta=1.0, lamb=0.1)
assert float(out["conv"]["kernel"].sum()) == 36.0
for name in ("ml_collections", "tqdm", "tensorboardX", "matplotlib"):
  assert importlib.util.find_spec(name) is None, name
try:
  import fkjax.training.train
except ModuleNotFoundError as e:
  print("training needs:", e.name)
"""

# pip's words when it cannot reach an index (offline machine): skip, not fail.
_OFFLINE = ("NewConnectionError", "Temporary failure in name resolution",
            "Network is unreachable", "Max retries exceeded")


def _run(cmd, timeout, **kwargs):
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                        **kwargs)


@pytest.mark.slow
def test_the_wheel_installs_the_library_alone(tmp_path):
  # Build from a copy: an in-tree build would leave build/ in the checkout.
  src = tmp_path / "src"
  src.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  shutil.copytree(REPO / "fkjax", src / "fkjax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  pip = [sys.executable, "-m", "pip"]
  built = _run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "dist"),
                str(src)], TIMEOUT_S)
  if built.returncode and any(w in built.stderr for w in _OFFLINE):
    pytest.skip("no package index reachable: " + built.stderr[-300:])
  assert built.returncode == 0, built.stderr[-2000:]
  (wheel,) = (tmp_path / "dist").glob("fkjax-*.whl")

  env = tmp_path / "venv"
  assert _run([sys.executable, "-m", "venv", str(env)],
              TIMEOUT_S).returncode == 0
  python = str(env / "bin" / "python")
  # The versions requirements.txt pins (as constraints: nothing more is
  # installed), so pip's cache serves what the checkout's environment has.
  installed = _run([python, "-m", "pip", "install", "-q", "-c",
                    str(REPO / "requirements.txt"), str(wheel)], TIMEOUT_S)
  if installed.returncode and any(w in installed.stderr for w in _OFFLINE):
    pytest.skip("no package index reachable: " + installed.stderr[-300:])
  assert installed.returncode == 0, installed.stderr[-2000:]

  proc = _run([python, "-c", _CHECK], TIMEOUT_S, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  # The training side is [train]'s: it misses one of its packages.
  missing = proc.stdout.strip().removeprefix("training needs: ")
  assert missing in ("ml_collections", "tqdm", "tensorboardX", "matplotlib")


# --------------------------------------------------------------------------
# Without the [train] extra, the entry points say what to install.

def test_the_extras_packages_are_pyprojects_train_extra():
  from fkjax import extras
  wanted = {canonicalize_name(Requirement(r).name)
            for r in _project()["optional-dependencies"]["train"]}
  assert {canonicalize_name(d) for d in extras.TRAIN.values()} == wanted
  # Each is imported by the name it is listed under.
  provided = md.packages_distributions()
  for module, dist in extras.TRAIN.items():
    assert canonicalize_name(dist) in map(canonicalize_name,
                                          provided.get(module, ())), module


# ``python -c _HIDDEN PACKAGE SCRIPT ARGS...`` runs SCRIPT (``-m`` MODULE) as
# if PACKAGE were not installed.
_HIDDEN = """
import runpy, sys
hidden = sys.argv[1]
class Hidden:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] == hidden:
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return None
sys.meta_path.insert(0, Hidden())
sys.argv = sys.argv[2:]
if sys.argv[0] == "-m":
  sys.argv = sys.argv[1:]
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
  runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _without(package, *command, **env):
  return subprocess.run(
      [sys.executable, "-c", _HIDDEN, package, *command], cwd=REPO,
      capture_output=True, text=True, timeout=120,
      env={**{k: v for k, v in os.environ.items()
              if not k.startswith("FKJAX_")}, "PYTHONPATH": str(REPO), **env})


@pytest.mark.parametrize("package,command", [
    ("ml_collections", ("train.py", "--config=configs/tiny.py",
                        "--workdir=unused")),
    ("absl", ("eval.py", "--workdir=unused")),
    ("absl", ("-m", "reproduce", "--help")),
])
def test_a_missing_train_package_is_one_line(package, command):
  from fkjax import extras
  proc = _without(package, *command)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1, proc.stderr
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith(f"error: {extras.TRAIN[package]} is not "
                             "installed"), proc.stderr
  assert lines[0].endswith(extras.INSTALL), proc.stderr


def test_traceback_shows_a_missing_packages_traceback():
  proc = _without("ml_collections", "train.py", "--traceback")
  assert proc.returncode == 1
  assert proc.stderr.splitlines()[-1] == (
      "ModuleNotFoundError: No module named 'ml_collections'"), proc.stderr


def test_the_handler_says_a_missing_train_package_in_one_line():
  """Inside the command's work (imports a function makes when it runs)."""
  from fkjax import cli, extras
  wrapped = RuntimeError("while building the loop")
  wrapped.__cause__ = ModuleNotFoundError("No module named 'tqdm.auto'",
                                          name="tqdm.auto")
  line = cli.error_line(wrapped)
  assert line == extras.missing_line(wrapped)
  assert line.startswith("tqdm is not installed") and extras.INSTALL in line
  # Any other missing module is a bug of the installation: its traceback.
  assert cli.error_line(ModuleNotFoundError("x", name="scipy")) is None


def _entry_points():
  """The repository's tools that use fkjax.cli and run as ``__main__``."""
  for path in sorted([*REPO.glob("*.py"), *REPO.glob("reproduce/*.py"),
                      *REPO.glob("benchmarks/*.py")]):
    text = path.read_text()
    if "from fkjax import cli" in text and "\nif __name__ ==" in text:
      yield path.relative_to(REPO)


@pytest.mark.parametrize("path", list(_entry_points()), ids=str)
def test_each_entry_point_starts_with_entry_start(path):
  # fkjax.entry.start() before any other import: a missing package (or
  # Ctrl-C) during them is one line too.
  import ast
  body = ast.parse((REPO / path).read_text()).body
  imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
  first = next(n for n in body if isinstance(n, ast.If))
  assert ast.unparse(first) == ("if __name__ == '__main__':\n"
                                "    entry.start()"), path
  assert all(n.lineno < first.lineno for n in imports
             if ast.unparse(n) in ("from fkjax import entry",
                                   "from __future__ import annotations"))
  assert all(n.lineno > first.lineno for n in imports
             if ast.unparse(n) not in ("from fkjax import entry",
                                       "from __future__ import annotations"))
