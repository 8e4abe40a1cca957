"""fkjax is the library: it works from ``pip install .``, without a checkout.

The repository's own tools beside it (``reproduce/``, ``configs/``,
``benchmarks/``) are not installed, so no module of fkjax may import them,
not even inside a function (read from the source: a lazy import would only
fail when called).
"""
import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("reproduce", "configs", "benchmarks")


def _imported(path):
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      yield node.module or ""


def _tool_imports(package):
  return [(str(path.relative_to(package)), name)
          for path in sorted(package.rglob("*.py"))
          for name in _imported(path)
          if name.split(".")[0] in TOOLS]


def test_no_module_of_fkjax_imports_the_repositorys_tools():
  assert _tool_imports(REPO / "fkjax") == []


def test_the_scan_sees_a_lazy_import(tmp_path):
  (tmp_path / "m.py").write_text(
      "def f():\n  from reproduce import tables\n  import configs.default\n")
  assert [n for _, n in _tool_imports(tmp_path)] == ["reproduce",
                                                     "configs.default"]


@pytest.mark.parametrize("tool", TOOLS)
def test_only_the_library_is_packaged(tool):
  project = tomllib.loads((REPO / "pyproject.toml").read_text())
  include = project["tool"]["setuptools"]["packages"]["find"]["include"]
  assert include == ["fkjax*"]
  assert (REPO / tool).is_dir() and not (REPO / "fkjax" / tool).exists()
