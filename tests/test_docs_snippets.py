"""Every Python snippet of README.md and docs/*.md runs as written.

A ```` ```python ```` block is run, in a fresh namespace and an empty working
directory, unless the line right above its fence says why not:

* ``<!-- not run: <reason> -->``: a fragment that uses the reader's own
  objects (``model``, ``batches``), or one that trains or reads CIFAR-10;
  it must still be valid Python.
* ``<!-- example: <name> -->``: the framework examples of docs/sparsity.md,
  which train and are run, with their results checked, by
  tests/test_sparsity_frameworks.py.
"""
from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^( *)```python\s*$")
_MARK = re.compile(r"^<!-- (not run|example): *(.*?) *-->$")


def _blocks() -> list[tuple[str, str | None, str]]:
  """``(file:line, marker kind or None, code)`` of every python block."""
  out = []
  for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
      fence = _FENCE.match(lines[i])
      if fence:
        end = i + 1
        while lines[end].strip() != "```":
          end += 1
        indent = len(fence.group(1))
        code = "\n".join(l[indent:] for l in lines[i + 1:end]) + "\n"
        mark = _MARK.match(lines[i - 1].strip()) if i else None
        if mark and mark.group(1) == "not run":
          assert mark.group(2), f"{path.name}:{i + 1}: say why it is not run"
        out.append((f"{path.relative_to(REPO)}:{i + 1}",
                    mark.group(1) if mark else None, code))
        i = end
      i += 1
  return out


_ALL = _blocks()
_RUN = [(where, code) for where, kind, code in _ALL if kind is None]


def test_every_snippet_is_run_or_says_why_not():
  assert _RUN, "no snippet is run"
  assert any(where.startswith("README.md") for where, _ in _RUN)
  for where, _, code in _ALL:
    compile(code, where, "exec")   # fragments too: valid Python


@pytest.mark.parametrize("where, code", _RUN, ids=[w for w, _ in _RUN])
def test_snippet_runs_as_written(where, code, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})  # pylint: disable=exec-used
