"""What one run is: a (row, seed) of a table at a scale, with everything to
run it (:func:`reproduce.run.plan.plan` makes them), and its extra
evaluations."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from fkjax.config import keys as config_keys
from fkjax.config import record as run_config
from fkjax.evaluation import strong_result as eval_strong_result
from reproduce.spec import tables as tables_lib


@dataclasses.dataclass
class ExtraEvalRun:
  """An extra evaluation of one run: what it fills and how it is read.

  Attributes:
    protocol: its stage is ``eval_<protocol>``.
    overrides: ``config.eval`` keys (eval.py flags), ``eval.protocol`` set.
    result_file: what it writes in the workdir.
    command: the equivalent ``eval.py`` command.
    columns: the metric columns it fills (``tables.METRICS`` keys).
    attacks: what it runs, for the log.
  """
  protocol: str
  overrides: dict[str, Any]
  result_file: str
  command: str
  columns: tuple[str, ...]
  attacks: str

  def read(self, result: Mapping[str, Any]) -> dict[str, float]:
    """Its columns from its result file's data (empty where it lacks them);
    the strong protocol's one column is its worst case over its attacks."""
    if self.columns == ("A_strong",):
      if result.get("protocol") != "strong":
        return {}
      strong = eval_strong_result.StrongResult.from_json(result)
      return {"A_strong": strong.worst_case.accuracy}
    attacks = result.get("attacks", {})
    return {c: attacks[tables_lib.ATTACK_OF[c]]["accuracy"]
            for c in self.columns if tables_lib.ATTACK_OF[c] in attacks}


@dataclasses.dataclass
class Run:
  """One (row, seed) of a table at a scale, with everything to run it."""
  table: tables_lib.Table
  row: tables_lib.Row
  owner_table: str
  owner_row: tables_lib.Row
  seed: int
  workdir: str
  config: ml_collections.ConfigDict
  train_command: str
  eval_command: str
  eval_result: str
  extra_evals: list[ExtraEvalRun]
  # <results>/<scale>/runs/<table>/<row>_seed<k>: where the finished run's
  # files are kept (reproduce.run.archive); None: not kept.
  archive: str | None = None
  # keep its evaluated weights (weights.npz) with its results: the scale's
  # publish_weights
  publish: bool = False

  @property
  def key(self) -> str:
    return f"{self.owner_table}/{self.owner_row.name}_seed{self.seed}"


def with_overrides(config: ml_collections.ConfigDict,
                   overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A copy of ``config`` with the dotted ``overrides`` set (each must be a
  key of it)."""
  new = ml_collections.ConfigDict(run_config.as_dict(config))
  for key, value in overrides.items():
    config_keys.set_value(new, key, value, must_exist=True)
  return new
