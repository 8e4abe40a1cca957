"""Published weights of the reproduction's runs, loaded by name.

Every finished run of the ``gpu`` and ``paper`` scales keeps its evaluated
weights (``weights.npz``) with its config and results under
``results/<scale>/runs/<table>/<row>_seed<k>/`` (docs/reproduction.md)::

  from fkjax import pretrained
  model, variables, config, results = pretrained.load(
      "gpu/table2/en2resnet20_rgsm_l0.05/seed0")
  logits = model.apply(variables, images, train=False,
                       rngs={"noise": key})
  results["metrics"]   # A1..A5, sparsity, as the table reports them

A name is ``<scale>/<table>/<row>/seed<k>``, the table's own row names
(``python -m reproduce list`` in the repository); a row that another table
trains resolves to that run (``results/run_names.json`` names them).

To evaluate a published run with ``eval.py`` (any protocol, the strong one
included), write it into a workdir first::

  python -m fkjax.pretrained gpu/table1/resnet20_none/seed0 --workdir=w
  python eval.py --workdir=w --config.eval.protocol=strong

The workdir holds the run's ``config.json`` and one checkpoint whose
parameters are the published ones (the optimizer state is a fresh one:
enough to evaluate, not to resume training). ADMM's dense ``w`` is not
published: its "of w" columns cannot be evaluated again.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, NamedTuple

from fkjax import readback
from fkjax.checkpoint import weights_file

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = re.compile(r"([\w.-]+)/(\w+)/([\w.-]+)/seed(\d+)")
# The run's record beside its weights: its metrics, as its table reports them.
RUN_RECORD = "reproduce_run.json"


class PretrainedError(ValueError):
  """A name that names no published run, or a run without weights."""


class Pretrained(NamedTuple):
  """A published run: its Flax model, variables, config and record."""
  model: Any
  variables: dict[str, Any]
  config: Any
  results: dict[str, Any]


def default_results() -> str:
  """``results/`` of the checkout fkjax runs from, else of the working
  directory."""
  here = os.path.join(_PACKAGE_ROOT, "results")
  return here if os.path.isdir(here) else "results"


def run_folder(results: str, scale: str, table: str, row: str,
               seed: int | str) -> str:
  """Where a run's published files are: ``<results>/<scale>/runs/<table>/
  <row>_seed<k>``."""
  return os.path.join(results, scale, "runs", table, f"{row}_seed{seed}")


def _read_json(path: str, shape: Any = dict, what: str = "") -> Any:
  """A published file, checked (:mod:`fkjax.readback`: a damaged one is
  named in one line)."""
  return readback.read_json(path, shape, what=what, missing_ok=False)


def _owner(results: str, table: str, row: str) -> tuple[str, str]:
  """The table and row that train ``table/row``'s runs, as the results'
  names file says; ``(table, row)`` where there is none."""
  path = os.path.join(results, weights_file.NAMES_FILE)
  if not os.path.exists(path):
    return table, row
  names = _read_json(path, readback.MapOf(readback.MapOf(str)),
                     "the results' names file")
  if table not in names:
    raise PretrainedError(f"no table {table!r}; one of {sorted(names)}")
  if row not in names[table]:
    raise PretrainedError(f"{table} has no row {row!r}; rows: "
                          f"{list(names[table])}")
  owner_table, owner_row = names[table][row].split("/")
  return owner_table, owner_row


def run_dir(name: str, results: str | None = None) -> str:
  """The folder under ``results/`` that holds the published run ``name``."""
  match = _NAME.fullmatch(name)
  if not match:
    raise PretrainedError(
        f"{name!r} is not <scale>/<table>/<row>/seed<k>, e.g. "
        "gpu/table2/en2resnet20_rgsm_l0.05/seed0")
  scale, table, row, seed = match.groups()
  results = results or default_results()
  table, row = _owner(results, table, row)
  return run_folder(results, scale, table, row, seed)


def available(results: str | None = None) -> list[str]:
  """The names of every run with published weights under ``results``."""
  root = results or default_results()
  out = []
  for dirpath, _, filenames in sorted(os.walk(root)):
    if weights_file.WEIGHTS_FILE not in filenames:
      continue
    parts = os.path.relpath(dirpath, root).split(os.sep)
    if len(parts) == 4 and parts[1] == "runs":
      row, _, seed = parts[3].rpartition("_seed")
      out.append(f"{parts[0]}/{parts[2]}/{row}/seed{seed}")
  return out


def load(name: str, results: str | None = None) -> Pretrained:
  """The published run ``name`` (``<scale>/<table>/<row>/seed<k>``).

  Raises:
    PretrainedError: no such run, or it has no published weights (it has
      not finished yet, or its scale does not publish them).
  """
  import ml_collections  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  folder = run_dir(name, results)
  path = os.path.join(folder, weights_file.WEIGHTS_FILE)
  if not os.path.exists(path):
    raise PretrainedError(
        f"no published weights for {name} ({path} is missing): the run has "
        "not finished, or its scale does not publish weights (gpu and "
        "paper do); python -m fkjax.pretrained lists those there are")
  config = ml_collections.ConfigDict(
      _read_json(os.path.join(folder, "config.json")))
  record_path = os.path.join(folder, RUN_RECORD)
  record = _read_json(record_path) if os.path.exists(record_path) else {}
  classes = 100 if config.dataset.name == "cifar100" else 10
  model = build.create_model(config, classes)
  return Pretrained(model, weights_file.load(path), config, record)


def write_workdir(name: str, workdir: str, results: str | None = None
                  ) -> str:
  """Writes a workdir that ``eval.py`` evaluates: the run's config and one
  checkpoint holding the published weights; returns the workdir.

  Reads the run's dataset (the state's shapes come from it, as in
  training). Refuses a workdir that already holds checkpoints.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  from fkjax import checkpoint  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  from fkjax.training import parallel  # pylint: disable=import-outside-toplevel
  from fkjax.config import record as run_config  # pylint: disable=import-outside-toplevel
  published = load(name, results)
  if checkpoint.has_checkpoints(workdir):
    raise PretrainedError(f"{workdir} already holds checkpoints: use an "
                          "empty or new folder")
  exp = build.Experiment.build(published.config)
  step = int(published.results.get("checkpoint_step") or 0)
  state = dict(exp.initial_state())
  state.update(parallel.replicate({
      "params": published.variables["params"],
      "batch_stats": published.variables["batch_stats"],
      "step": np.asarray(step, np.int32)}, exp.mesh))
  run_config.save(published.config, workdir)
  checkpointer = checkpoint.Checkpointer(workdir)
  try:
    # A metric makes it the "best" checkpoint eval.py reads by default.
    checkpointer.save(step, state, val_accuracy=0.0)
  finally:
    checkpointer.close()
  return workdir


def main(argv: list[str] | None = None) -> int:
  """``python -m fkjax.pretrained [NAME --workdir=DIR]``: lists the
  published runs, or writes one into a workdir for ``eval.py``."""
  p = argparse.ArgumentParser(prog="python -m fkjax.pretrained",
                              description=main.__doc__)
  p.add_argument("name", nargs="?", help="<scale>/<table>/<row>/seed<k>")
  p.add_argument("--workdir", help="where to write it for eval.py")
  p.add_argument("--results", default=None,
                 help="the results folder (default: the checkout's)")
  args = p.parse_args(argv)
  if not args.name:
    names = available(args.results)
    print("\n".join(names) if names else "no published weights yet")
    return 0
  if not args.workdir:
    print("error: --workdir is needed to write a published run",
          file=sys.stderr)
    return 2
  try:
    write_workdir(args.name, args.workdir, args.results)
  except PretrainedError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except readback.DamagedFileError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"python eval.py --workdir={args.workdir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
