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
(``python -m reproduce list``); a row that another table trains
(``(= table/row)`` in the listing) resolves to that run.

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

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = re.compile(r"([\w.-]+)/(\w+)/([\w.-]+)/seed(\d+)")


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


def run_dir(name: str, results: str | None = None) -> str:
  """The folder under ``results/`` that holds the published run ``name``."""
  # Imported here: fkjax's top-level imports stay light.
  from reproduce import archive  # pylint: disable=import-outside-toplevel
  from reproduce import tables  # pylint: disable=import-outside-toplevel
  match = _NAME.fullmatch(name)
  if not match:
    raise PretrainedError(
        f"{name!r} is not <scale>/<table>/<row>/seed<k>, e.g. "
        "gpu/table2/en2resnet20_rgsm_l0.05/seed0")
  scale, table_name, row_name, seed = match.groups()
  if table_name not in tables.TABLES:
    raise PretrainedError(f"no table {table_name!r}; one of "
                          f"{sorted(tables.TABLES)}")
  try:
    row = tables.TABLES[table_name].row(row_name)
  except KeyError as e:
    raise PretrainedError(e.args[0]) from e
  if row.shared:
    owner_table, row = tables.resolve_shared(row)
    table_name = owner_table.name
  return archive.archive_dir(results or default_results(), scale, table_name,
                             row.name, int(seed))


def available(results: str | None = None) -> list[str]:
  """The names of every run with published weights under ``results``."""
  from reproduce import weights  # pylint: disable=import-outside-toplevel
  root = results or default_results()
  out = []
  for dirpath, _, filenames in sorted(os.walk(root)):
    if weights.WEIGHTS_FILE not in filenames:
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
  from fkjax import experiment  # pylint: disable=import-outside-toplevel
  from reproduce import files  # pylint: disable=import-outside-toplevel
  from reproduce import weights  # pylint: disable=import-outside-toplevel
  folder = run_dir(name, results)
  path = os.path.join(folder, weights.WEIGHTS_FILE)
  if not os.path.exists(path):
    raise PretrainedError(
        f"no published weights for {name} ({path} is missing): the run has "
        "not finished, or its scale does not publish weights (gpu and "
        "paper do); python -m fkjax.pretrained lists those there are")
  config = ml_collections.ConfigDict(
      files.load_json(os.path.join(folder, "config.json")))
  record = files.load_json(os.path.join(folder, "reproduce_run.json")) or {}
  classes = 100 if config.dataset.name == "cifar100" else 10
  model = experiment.create_model(config, classes)
  return Pretrained(model, weights.load(path), config, record)


def write_workdir(name: str, workdir: str, results: str | None = None
                  ) -> str:
  """Writes a workdir that ``eval.py`` evaluates: the run's config and one
  checkpoint holding the published weights; returns the workdir.

  Reads the run's dataset (the state's shapes come from it, as in
  training). Refuses a workdir that already holds checkpoints.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  from fkjax import checkpoint  # pylint: disable=import-outside-toplevel
  from fkjax import experiment  # pylint: disable=import-outside-toplevel
  from fkjax import parallel  # pylint: disable=import-outside-toplevel
  from fkjax import run_config  # pylint: disable=import-outside-toplevel
  published = load(name, results)
  if checkpoint.has_checkpoints(workdir):
    raise PretrainedError(f"{workdir} already holds checkpoints: use an "
                          "empty or new folder")
  exp = experiment.Experiment.build(published.config)
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
  print(f"python eval.py --workdir={args.workdir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
