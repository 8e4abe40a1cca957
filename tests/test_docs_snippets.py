"""Every Python snippet of README.md and docs/*.md runs as written; the
docs' links resolve; the README's commands are CI's.

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


# ------------------------------------------------------------------ links
_LINK = re.compile(r"\]\(([^()\s]+)\)")
# Hand-written pages; the generated results/**/*.md are their tool's.
_PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
          REPO / "results" / "cpu" / "notes.md",
          REPO / "results" / "pilots" / "README.md",
          *sorted((REPO / "benchmarks" / "results").glob("*/README.md"))]


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  return {_slug(line.lstrip("#")) for line in path.read_text().splitlines()
          if re.match(r"#{1,6} ", line)}


def test_the_slug_is_githubs():
  assert _slug(" CPUs without AVX-512") == "cpus-without-avx-512"
  assert _slug(" `cpu`, `--variant=long`: twice") == "cpu---variantlong-twice"


@pytest.mark.parametrize("page", _PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
  for target in _LINK.findall(page.read_text()):
    if "://" in target or target.startswith("mailto:"):
      continue
    file, _, anchor = target.partition("#")
    dest = (page.parent / file).resolve() if file else page
    assert dest.exists(), f"{page.relative_to(REPO)}: {target} does not exist"
    if anchor and dest.suffix == ".md":
      assert anchor in _anchors(dest), (
          f"{page.relative_to(REPO)}: {target}: no such heading")


def test_the_reproduction_page_links_every_committed_overview():
  page = (REPO / "docs" / "reproduction.md").read_text()
  overviews = sorted((REPO / "results").glob("*/overview.md"))
  assert overviews
  for path in overviews:
    assert f"](../{path.relative_to(REPO)})" in page, (
        f"docs/reproduction.md does not link {path.relative_to(REPO)}")


# ------------------------------------------------------ README and CI agree
def test_the_readme_s_first_two_commands_are_what_ci_runs():
  readme = (REPO / "README.md").read_text()
  blocks = re.findall(r"^```bash\n(.*?)^```", readme, re.S | re.M)
  assert len(blocks) >= 2
  ci = (REPO / ".ci" / "run").read_text().splitlines()
  for block in blocks[:2]:
    assert block.strip() in ci, f"README command not in .ci/run: {block}"


# ------------------------------------------------- what a user sees first
def test_the_readme_s_first_screen_says_what_is_reproduced_where():
  first = "\n".join((REPO / "README.md").read_text().splitlines()[:45])
  assert first.count("```bash") == 2   # set-up + demo, and the tests
  for scale in ("cpu", "cpu-long", "gpu", "paper"):
    assert f"| `{scale}` |" in first, f"no line for the {scale} scale"
  for generated in ("results/cpu/overview.md", "results/cpu/claims.md",
                    "results/cpu-long/overview.md"):
    assert f"]({generated})" in first, f"the first screen lacks {generated}"


def test_the_reproduction_page_is_a_how_to_of_at_most_250_lines():
  lines = (REPO / "docs" / "reproduction.md").read_text().splitlines()
  assert len(lines) <= 250, "results and their reading go to results/"
