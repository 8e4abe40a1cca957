"""What a sweep may vary, and the runs a ``config.sweep`` section describes.

A sweep trains runs that differ only in values that leave every shape and
every branch of the program alone (:data:`SWEEPABLE_KEYS`); everything else
of their configs must be equal. :func:`check_configs` says in one line where
two runs differ otherwise.
"""
from __future__ import annotations

import ast
import copy
import itertools
import json
import math
from typing import Any, Mapping, Sequence

import ml_collections

from fkjax.config import keys as config_keys
from fkjax.config import record as run_config

ConfigError = run_config.ConfigError

# Values a sweep may vary: they change numbers, not shapes or branches.
SWEEPABLE_KEYS: tuple[str, ...] = (
    "seed", "training.data_seed",
    "training.learning_rate", "training.weight_decay",
    "model.noise_coef",
    "attack.epsilon", "attack.step_size",
    "sparsity.beta", "sparsity.lamb", "sparsity.lamb1", "sparsity.lamb2",
    "sparsity.rho", "sparsity.percent",
)
# Used on the host (PRNG keys, data order); the others are traced arrays.
HOST_KEYS: tuple[str, ...] = ("seed", "training.data_seed")
TRACED_KEYS: tuple[str, ...] = tuple(k for k in SWEEPABLE_KEYS
                                     if k not in HOST_KEYS)
# 0 removes a piece of the program (the weight-decay term, the noise): all
# runs of a sweep have them, or none.
NONZERO_KEYS: tuple[str, ...] = ("training.weight_decay", "model.noise_coef")

SHARD_MODES = ("batch", "runs")
DATA_ORDERS = ("shared", "per_run")
# The config section of a sweep (configs/sweep.py); no run records it.
SECTION = "sweep"


def without_section(config: ml_collections.ConfigDict
                    ) -> ml_collections.ConfigDict:
  """A copy of ``config`` without its ``sweep`` section: a run's config."""
  config = copy.deepcopy(config)
  if SECTION in config:
    with config.unlocked():
      del config[SECTION]
  return config


def _flat(config: ml_collections.ConfigDict) -> dict[str, Any]:
  flat = run_config.flatten(run_config.as_dict(config))
  return {k: v for k, v in flat.items()
          if not (k == SECTION or k.startswith(SECTION + "."))}


def effective_data_seed(config: Mapping[str, Any]) -> int:
  seed = config_keys.get(config, "training.data_seed")
  return config["seed"] if seed is None else seed


def check_configs(configs: Sequence[ml_collections.ConfigDict],
                  names: Sequence[str] | None = None) -> tuple[str, ...]:
  """Validates the runs of a sweep; returns the keys whose values differ.

  Raises:
    ConfigError: an invalid config, or two runs differing in a key outside
      :data:`SWEEPABLE_KEYS` (or in whether a :data:`NONZERO_KEYS` value is
      0), in one line naming the key, both runs and both values.
  """
  if not configs:
    raise ConfigError("a sweep needs at least one run")
  names = list(names) if names is not None else [
      f"run {i}" for i in range(len(configs))]
  for name, config in zip(names, configs):
    try:
      run_config.validate(config)
    except ConfigError as e:
      raise ConfigError(f"{name}: {e}") from None
  flats = [_flat(c) for c in configs]
  varying = []
  missing = object()
  for key in sorted(set().union(*flats)):
    values = [f.get(key, missing) for f in flats]
    if all(v == values[0] for v in values[1:]):
      continue
    if key not in SWEEPABLE_KEYS:
      i = next(i for i, v in enumerate(values) if v != values[0])
      show = lambda v: "missing" if v is missing else repr(v)
      raise ConfigError(
          f"the runs of a sweep may differ only in "
          f"{', '.join(SWEEPABLE_KEYS)}; {names[i]} has config.{key}="
          f"{show(values[i])}, {names[0]} has {show(values[0])}: train them "
          "in separate sweeps")
    if key in NONZERO_KEYS and len({bool(v) for v in values}) > 1:
      raise ConfigError(
          f"config.{key} is 0 in some runs of the sweep and not in others "
          f"({', '.join(f'{n}: {v!r}' for n, v in zip(names, values))}); "
          "0 removes a part of the program: sweep the zero and the non-zero "
          "values separately")
    varying.append(key)
  return tuple(varying)


def groups(configs: Sequence[ml_collections.ConfigDict],
           max_size: int | None = None) -> list[list[int]]:
  """Indices of ``configs`` grouped into sweeps, in first-seen order.

  Configs land in one group when they differ only in
  :data:`SWEEPABLE_KEYS` (and agree on which :data:`NONZERO_KEYS` are 0);
  ``max_size`` splits larger groups (memory) into the fewest groups of
  sizes as equal as possible. A reproduction runner trains
  each group with :func:`fkjax.training.sweep.train_sweep`.
  """
  if max_size is not None and max_size < 1:
    raise ValueError(f"max_size must be >= 1, got {max_size}")
  by_key: dict[str, list[int]] = {}
  for i, config in enumerate(configs):
    flat = _flat(config)
    key = {k: v for k, v in flat.items() if k not in SWEEPABLE_KEYS}
    key.update({f"{k} != 0": bool(flat.get(k)) for k in NONZERO_KEYS})
    by_key.setdefault(json.dumps(key, sort_keys=True, default=str),
                      []).append(i)
  out = []
  for members in by_key.values():
    # the fewest groups of at most max_size, of sizes as equal as possible
    parts = -(-len(members) // max_size) if max_size else 1
    size, extra = divmod(len(members), parts)
    start = 0
    for part in range(parts):
      end = start + size + (part < extra)
      out.append(members[start:end])
      start = end
  return out


def with_data_seed(configs: Sequence[ml_collections.ConfigDict],
                   data_order: str) -> list[ml_collections.ConfigDict]:
  """The runs' configs for ``data_order``.

  ``"shared"``: every run takes one data seed (its data order and
  augmentation): the ``training.data_seed`` the runs set, else the first
  run's seed; it is recorded as ``training.data_seed`` in the runs whose own
  seed differs, so that each run's ``config.json`` still says exactly what
  it trained. ``"per_run"``: the configs unchanged, each run its own.

  Raises:
    ConfigError: ``"shared"`` with runs that set different data seeds.
  """
  if data_order not in DATA_ORDERS:
    raise ConfigError(f"sweep data_order={data_order!r} is invalid: one of "
                      f"{list(DATA_ORDERS)}")
  out = [copy.deepcopy(c) for c in configs]
  if data_order == "shared" and out:
    explicit = {config_keys.get(c, "training.data_seed") for c in out} - {None}
    if len(explicit) > 1:
      raise ConfigError(
          "the runs set different config.training.data_seed values "
          f"({sorted(explicit)}), but the sweep's data order is 'shared': "
          "use data_order='per_run' (config.sweep.data_order)")
    # a data seed a user set is the stream; else the first run's seed
    shared = explicit.pop() if explicit else effective_data_seed(out[0])
    for c in out:
      if effective_data_seed(c) != shared:
        config_keys.set_value(c, "training.data_seed", shared)
  return out


# --------------------------------------------------------------------------
# config.sweep: the runs as text.


def parse_axes(text: str) -> list[tuple[str, list[Any]]]:
  """``"seed=0,1,2; sparsity.lamb1=0.01,0.05"`` -> ``[(key, values), ...]``.

  Keys are dotted config keys (``config.`` optional); values are Python
  literals.
  """
  axes = []
  for part in filter(None, (p.strip() for p in (text or "").split(";"))):
    key, sep, values = part.partition("=")
    key = key.strip().removeprefix("config.")
    if not sep or not key:
      raise ConfigError(f"config.sweep: {part!r} is not KEY=V1,V2,...")
    if key not in SWEEPABLE_KEYS:
      raise ConfigError(f"config.sweep: config.{key} cannot be swept; "
                        f"sweepable: {', '.join(SWEEPABLE_KEYS)}")
    parsed = []
    for v in filter(None, (v.strip() for v in values.split(","))):
      try:
        parsed.append(ast.literal_eval(v))
      except (ValueError, SyntaxError):
        raise ConfigError(
            f"config.sweep: {key}: {v!r} is not a number") from None
    if not parsed:
      raise ConfigError(f"config.sweep: {key} has no values")
    if any(k == key for k, _ in axes):
      raise ConfigError(f"config.sweep: {key} given twice")
    axes.append((key, parsed))
  return axes


def _format_value(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def run_name(index: int, overrides: Mapping[str, Any]) -> str:
  """``03_lamb1-0.05_seed-1``: the run's sub-directory of a sweep."""
  parts = [f"{k.split('.')[-1]}-{_format_value(v)}"
           for k, v in overrides.items()]
  return "_".join([f"{index:02d}", *parts])


def expand(config: ml_collections.ConfigDict
           ) -> list[tuple[str, dict[str, Any], ml_collections.ConfigDict]]:
  """The runs of ``config.sweep``: ``(name, overrides, run config)`` each.

  ``config.sweep.product`` gives axes whose values combine in every way
  (``"sparsity.lamb1=0.01,0.05; seed=0,1,2"``: 6 runs);
  ``config.sweep.zip`` gives axes of equal length that vary together (run
  ``i`` takes the ``i``-th value of each); both together combine as a
  product. The run configs have no ``sweep`` section.
  """
  section = config.get(SECTION) or {}
  product = parse_axes(section.get("product", ""))
  zipped = parse_axes(section.get("zip", ""))
  both = {k for k, _ in product} & {k for k, _ in zipped}
  if both:
    raise ConfigError(f"config.sweep: {sorted(both)[0]} is in both product "
                      "and zip")
  lengths = {len(v) for _, v in zipped}
  if len(lengths) > 1:
    raise ConfigError("config.sweep.zip: every key needs as many values ("
                      + ", ".join(f"{k}: {len(v)}" for k, v in zipped) + ")")
  zip_rows = ([dict(zip([k for k, _ in zipped], row))
               for row in zip(*[v for _, v in zipped])] if zipped else [{}])
  product_rows = [dict(zip([k for k, _ in product], row))
                  for row in itertools.product(*[v for _, v in product])]
  base = without_section(config)
  runs = []
  for i, (p_row, z_row) in enumerate(itertools.product(product_rows,
                                                       zip_rows)):
    overrides = {**p_row, **z_row}
    run = copy.deepcopy(base)
    for key, value in list(overrides.items()):
      current = config_keys.get(run, key)
      if isinstance(current, float) and isinstance(value, int):
        value = float(value)
      if key in ("seed", "training.data_seed") and not (
          isinstance(value, int) and not isinstance(value, bool)):
        raise ConfigError(f"config.sweep: {key}={value!r} is not an integer")
      if not isinstance(value, (int, float)) or (
          isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"config.sweep: {key}={value!r} is not a number")
      config_keys.set_value(run, key, value)
      overrides[key] = value
    name = run_name(i, overrides)
    same = next((n for n, o, _ in runs if o == overrides), None)
    if same is not None:
      # The same settings twice would train the same net twice, in two
      # workdirs, as if they were two results.
      raise ConfigError(
          f"config.sweep: runs {same} and {name} are the same run ("
          + ", ".join(f"{k}={_format_value(v)}" for k, v in overrides.items())
          + "): a value is listed twice")
    runs.append((name, overrides, run))
  return runs


def section_option(config: ml_collections.ConfigDict, name: str,
                   default: str) -> str:
  section = config.get(SECTION) or {}
  return section.get(name) or default
