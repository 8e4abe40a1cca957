"""The table that ends a sweep: one row per run, its swept values and what
it reached (validation and test accuracy, sparsity)."""
from __future__ import annotations

import sys
from typing import Any, Mapping, Sequence, TextIO

import ml_collections

from fkjax.config import record as run_config
from fkjax.training.sweep import spec


_DATA_SEED = "training.data_seed"


def _flat(config: ml_collections.ConfigDict) -> dict[str, Any]:
  flat = run_config.flatten(run_config.as_dict(config))
  # None stands for the run's seed; a shared batch stream is recorded by the
  # runs whose own seed differs: the seed it stands for is what counts.
  flat[_DATA_SEED] = spec.effective_data_seed(config)
  return flat


def swept_keys(configs: Sequence[ml_collections.ConfigDict]) -> list[str]:
  """The dotted keys whose values differ between the runs (how a run is
  executed, e.g. the data directory, does not count; nor the data seed
  where each run's is its own seed)."""
  flats = [_flat(c) for c in configs]
  keys = sorted(set().union(*flats)) if flats else []
  own_seeds = all(f[_DATA_SEED] == f.get("seed") for f in flats)
  return [k for k in keys if not run_config.is_environment_key(k)
          and not (k == _DATA_SEED and own_seeds)
          and len({repr(f.get(k)) for f in flats}) > 1]


def _number(value: Any, digits: int = 2) -> str:
  return "-" if value is None else f"{float(value):.{digits}f}"


def sweep_table(configs: Sequence[ml_collections.ConfigDict],
                names: Sequence[str],
                summaries: Sequence[Mapping[str, Any]]) -> str:
  """A Markdown table of the runs of a sweep.

  Args:
    configs: the runs' configs.
    names: the runs' names.
    summaries: what ``train_sweep`` returns per run: ``{"validation": the
      last epoch's metrics, "test": the final evaluation (if any)}``.

  Returns:
    The table: the run's name, its swept values, its validation accuracies
    (last epoch, %), its test accuracies per attack (%, the final
    evaluation of the best checkpoint) and its weight and channel sparsity
    (%, of the evaluated weights; the last epoch's where there is no test).
  """
  keys = swept_keys(configs)
  flats = [_flat(c) for c in configs]
  val_names = sorted({k for s in summaries for k in s.get("validation", {})
                      if k.startswith("val_") and k.endswith("_accuracy")})
  test_names: list[str] = []
  for s in summaries:
    for name in (s.get("test") or {}).get("attacks", {}):
      if name not in test_names:
        test_names.append(name)
  header = (["run", *keys]
            + [f"val {v[len('val_'):-len('_accuracy')]} %" for v in val_names]
            + [f"test {t} %" for t in test_names]
            + ["sparsity %", "channel sparsity %"])
  rows = []
  for name, flat, s in zip(names, flats, summaries):
    val, test = s.get("validation", {}), s.get("test") or {}
    attacks = test.get("attacks", {})
    where = test if "weight_sparsity" in test else val
    rows.append(
        [name, *(repr(flat.get(k)) if isinstance(flat.get(k), str)
                 else str(flat.get(k)) for k in keys)]
        + [_number(val.get(v)) for v in val_names]
        + [_number((attacks.get(t) or {}).get("accuracy")) for t in test_names]
        + [_number(where.get("weight_sparsity")),
           _number(where.get("channel_sparsity"))])
  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join(" --- " for _ in header) + "|"]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


def report(configs: Sequence[ml_collections.ConfigDict],
           names: Sequence[str], summaries: list[dict[str, Any]], *,
           enabled: bool = True, stream: TextIO | None = None
           ) -> list[dict[str, Any]]:
  """Prints :func:`sweep_table` (where ``enabled``: process 0) and returns
  ``summaries`` unchanged."""
  if enabled:
    print(f"sweep of {len(names)} runs:\n"
          + sweep_table(configs, names, summaries),
          file=stream or sys.stdout, flush=True)
  return summaries
