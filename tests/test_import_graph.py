"""The import graphs of fkjax, and of the tools beside it (reproduce/,
benchmarks/), have no cycle.

Every import counts, at module level or inside a function: a function-level
import only hides a cycle from Python's loader, not from the reader who has
to understand one module before the other. The tools import at module level
only, so that one reads a module's dependencies at its top.
"""
from __future__ import annotations

import ast
import pathlib

import fkjax

REPO = pathlib.Path(fkjax.__file__).parent.parent
PACKAGES = ("fkjax", "reproduce", "benchmarks")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _modules(package: str) -> dict[str, pathlib.Path]:
  return {_module_name(p): p
          for p in sorted((REPO / package).rglob("*.py"))}


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
  """The fkjax modules ``path`` imports (``from a import b`` names ``a.b``
  where that is a module, else ``a``)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        found.add(sub if sub in known else node.module)
  return {name for name in found if name in known}


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
  """module -> the modules of ``packages`` it imports. The packages
  themselves are left out: every module's parent is imported first
  anyway."""
  modules = {}
  for package in packages:
    modules.update(_modules(package))
  known = set(modules)
  return {name: _imports(path, known) - {name, *packages}
          for name, path in modules.items()}


def _inner_import_lines(source: str) -> set[int]:
  """The lines of the imports inside a function of ``source``."""
  return {inner.lineno for node in ast.walk(ast.parse(source))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          for inner in ast.walk(node)
          if isinstance(inner, (ast.Import, ast.ImportFrom))}


def function_level_imports(package: str) -> list[str]:
  """``module:line`` of every import inside a function of ``package``."""
  return sorted(f"{name}:{line}"
                for name, path in _modules(package).items()
                for line in _inner_import_lines(path.read_text()))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
  state: dict[str, int] = {}   # 1: on the path, 2: done
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    path.append(node)
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == 1:
        return path[path.index(dep):] + [dep]
      if dep not in state:
        cycle = visit(dep)
        if cycle:
          return cycle
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c",
                                                                "a"]
  assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_function_level_imports():
  graph = import_graph()
  # eval_run imports fkjax.evaluation.plots inside a function (matplotlib on demand).
  assert "fkjax.evaluation.plots" in graph["fkjax.evaluation.run"]
  assert "fkjax.attacks.common" in graph["fkjax.attacks.auto_pgd"]


def test_the_graph_covers_the_tools():
  graph = import_graph()
  assert "reproduce.__main__" in graph
  assert any(name.startswith("benchmarks.") for name in graph)


def test_no_import_cycle_in_fkjax_or_its_tools():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_function_level_imports_are_found():
  source = ("import os\n"
            "def f():\n"
            "  import json\n"
            "  def g():\n"
            "    from a import b\n")
  assert _inner_import_lines(source) == {3, 5}


def test_reproduce_imports_at_module_level():
  assert function_level_imports("reproduce") == []
