"""A run's config: validation, and ``<workdir>/config.json`` as its record.

``validate`` checks a config before any data is loaded or anything compiled,
so a typo ends in one line rather than after minutes of work.

A workdir's ``config.json`` is the source of truth for what its run computes.
``train.py`` on an existing run must be given the same config (only the keys
in :data:`ENVIRONMENT_KEYS` may differ: where data and caches live, devices,
speed, progress output, the evaluation settings); ``eval.py`` starts from the
saved config and lets the command line change only those keys.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

import ml_collections

from fkjax import atomic
from fkjax import readback
from fkjax.config import history
from fkjax.config import keys as config_keys
from fkjax.config import schema as config_schema
from fkjax.config.names import ATTACK_NAMES as _ATTACK_NAMES

CONFIG_FILE = "config.json"
# A config.json is an object of sections (and top-level values).
_SAVED_SHAPE = dict

# Keys (a section name covers the whole section) that say how or where a run
# is executed or evaluated, not what it trains: they may differ between the
# command that trained a run and one that resumes or evaluates it.
ENVIRONMENT_KEYS: tuple[str, ...] = (
    "eval", "kernels", "progress", "compilation_cache_dir", "num_devices",
    "dataset.data_dir", "dataset.tfds_data_dir", "dataset.download",
    "training.checkpoint_every_steps", "validation.batch_size",
    "training.data_pipeline", "training.steps_per_dispatch",
)


# Defined beside the rules that raise it; callers keep naming it here.
ConfigError = config_schema.ConfigError


# --------------------------------------------------------------------------
# Validation.


def validate(config: ml_collections.ConfigDict,
             attack_names: Iterable[str] = _ATTACK_NAMES) -> None:
  """Raises :class:`ConfigError` for the first invalid value of ``config``.

  Checks every value whose mistake would otherwise surface late (after the
  data are loaded or a step compiled) or not at all (a silently wrong run):
  sizes and counts, depth ``6n+2``, the attack radius in ``(0, 1]`` (images
  live in ``[0, 1]``: 8/255, not 8), the learning-rate schedule, the
  sparsifier's hyperparameters, the attack and checkpoint names. What each
  key may hold is declared once, in :func:`fkjax.config.schema.rules`.
  """
  for key, check in config_schema.rules(tuple(attack_names)):
    value = config_keys.get(config, key)
    problem = check(value, config)
    if isinstance(problem, tuple):
      value, problem = problem
    if problem is not None:
      raise config_schema.invalid(key, value, problem)


# --------------------------------------------------------------------------
# The run's record: <workdir>/config.json.


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; tuples become lists (as JSON)."""
  flat: dict[str, Any] = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      flat.update(flatten(value, name + "."))
    else:
      flat[name] = list(value) if isinstance(value, tuple) else value
  return flat


def as_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config as plain JSON data."""
  return json.loads(config.to_json_best_effort())


def is_environment_key(key: str) -> bool:
  """Whether ``key`` is one of :data:`ENVIRONMENT_KEYS` or inside one."""
  # One set look-up and one startswith of a tuple: every comparison of two
  # configs asks this of each of their ~200 keys.
  return key in _ENVIRONMENT or key.startswith(_ENVIRONMENT_SECTIONS)


_ENVIRONMENT = frozenset(ENVIRONMENT_KEYS)
_ENVIRONMENT_SECTIONS = tuple(k + "." for k in ENVIRONMENT_KEYS)


def differences(a: Mapping[str, Any], b: Mapping[str, Any],
                *, ignore_environment: bool = True
                ) -> list[tuple[str, Any, Any]]:
  """``(key, a's value, b's value)`` for every key where two configs differ.

  ``a`` is the saved record: a key it lacks that :mod:`fkjax.config.history`
  lists (added to fkjax after the run was trained) reads as the value that
  reproduces how it ran; any other key it lacks is not a difference.
  """
  fa, fb = flatten(history.complete(a)), flatten(b)
  missing = object()
  out = []
  for key in sorted(set(fa) | set(fb)):
    if ignore_environment and is_environment_key(key):
      continue
    va, vb = fa.get(key, missing), fb.get(key, missing)
    if va is not missing and va != vb:
      out.append((key, va, None if vb is missing else vb))
  return out


def _format(diffs: list[tuple[str, Any, Any]], first: str, second: str,
            limit: int = 3) -> str:
  shown = "; ".join(f"config.{k}: {first} {va!r}, {second} {vb!r}"
                    for k, va, vb in diffs[:limit])
  more = f" (and {len(diffs) - limit} more)" if len(diffs) > limit else ""
  return shown + more


def config_path(workdir: str) -> str:
  return os.path.join(workdir, CONFIG_FILE)


def load_saved(workdir: str) -> dict[str, Any] | None:
  """The saved ``config.json`` of ``workdir`` as plain data, or None.

  Raises:
    ConfigError: it is not whole JSON, or not an object of sections.
  """
  path = config_path(workdir)
  try:
    return readback.read_json(path, _SAVED_SHAPE, what="the run's config")
  except readback.DamagedFileError as e:
    raise ConfigError(f"{e} (it records the run's config; a new workdir "
                      "starts afresh)") from e


def missing_keys(saved: Mapping[str, Any],
                 config: ml_collections.ConfigDict) -> list[str]:
  """The keys that change what ``config`` computes and that the saved
  record ``saved`` lacks (those :mod:`fkjax.config.history` completes, and
  unset placeholders, aside): a record emptied or cut down says nothing of
  them, so a resume cannot be compared with it on them."""
  have = flatten(history.complete(saved))
  return sorted(k for k, v in flatten(as_dict(config)).items()
                if k not in have and v is not None
                and not is_environment_key(k))


def save(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes ``config.json`` atomically (a kill never leaves half a file)."""
  atomic.write_json(config_path(workdir), as_dict(config), sort_keys=True)


def check_same_run(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses to resume the run in ``workdir`` with a different config.

  Only :data:`ENVIRONMENT_KEYS` may differ: a different batch size, schedule
  or model would silently change what the resumed run trains. For a run
  with checkpoints only (the caller checks): where ``config.json`` is
  missing, or lacks keys (:func:`missing_keys`: emptied or cut down), the
  config its latest checkpoint recorded (:mod:`fkjax.checkpoint.run_record`)
  must agree too; checkpoints that record none are not resumed without a
  whole record.
  """
  saved = load_saved(workdir)
  if saved is not None:
    diffs = _differences_from(saved, config)
    if diffs:
      raise ConfigError(
          f"{workdir} holds a run with another config ("
          + _format(diffs, "saved", "now") + "); rerun with the run's config "
          "(eval.py reads it from the workdir) or use a new workdir")
    missing = missing_keys(saved, config)
    if not missing:
      return
    _check_checkpoint_record(
        config, workdir, f"{config_path(workdir)} lacks "
        + ", ".join(f"config.{k}" for k in missing[:3])
        + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""))
    return
  _check_checkpoint_record(config, workdir,
                           f"{config_path(workdir)} is missing")


def _check_checkpoint_record(config: ml_collections.ConfigDict,
                             workdir: str, missing: str) -> None:
  """Refuses to resume a run whose ``config.json`` is missing or incomplete
  (``missing`` says which) unless its checkpoint recorded the same
  config."""
  # Here, not at the top: the package fkjax.checkpoint loads orbax and JAX,
  # and a config is validated without them.
  from fkjax.checkpoint import run_record  # pylint: disable=import-outside-toplevel
  # A record saved while config.json was cut down is as incomplete: the
  # latest whole one counts.
  found = next(((step, recorded) for step, recorded
                in run_record.recorded_configs(workdir)
                if not missing_keys(recorded, config)), None)
  if found is None:
    raise ConfigError(
        f"{missing}, and the checkpoints in {workdir} do not record the "
        "config they were trained with in full (an older fkjax saved them, "
        "or recorded that file as it was): restore "
        f"{CONFIG_FILE}, or use a new workdir")
  step, recorded = found
  diffs = _differences_from(recorded, config)
  if diffs:
    raise ConfigError(
        f"{missing}, and its checkpoint step {step} was trained with another "
        "config (" + _format(diffs, "checkpoint", "now") + "); rerun with "
        "that config or use a new workdir")


# What config.precision="auto" becomes where a run trains (the values of
# fkjax.training.precision.AUTO, read here without JAX).
AUTO_PRECISIONS = ("float32", "tf32")


def _differences_from(recorded: Mapping[str, Any],
                      config: ml_collections.ConfigDict
                      ) -> list[tuple[str, Any, Any]]:
  """:func:`differences` of ``config`` from a run's ``recorded`` config,
  a precision of ``"auto"`` read as the one recorded."""
  return differences(recorded, _as_recorded(as_dict(config), recorded))


def _as_recorded(config: dict[str, Any], saved: Mapping[str, Any]
                 ) -> dict[str, Any]:
  """``config`` with a precision of ``"auto"`` read as the one ``saved``
  recorded where auto could have given it: a config file that leaves the
  precision to the platform describes the run whichever it took."""
  recorded = history.complete(saved).get("precision")
  if config.get("precision") == "auto" and recorded in AUTO_PRECISIONS:
    config = {**config, "precision": recorded}
  return config


def config_for_eval(workdir: str, cli: ml_collections.ConfigDict | None,
                    overrides: Mapping[str, Any],
                    config_given: bool) -> ml_collections.ConfigDict:
  """The config that evaluates the run in ``workdir``.

  The workdir's ``config.json`` is the source of truth. ``overrides``
  (``--config.KEY=VALUE`` flags, by dotted key) may change only
  :data:`ENVIRONMENT_KEYS`. When the user also named a config file
  (``config_given``), it must describe the same run.

  Raises:
    ConfigError: no ``config.json`` in ``workdir``, an override of a key that
      changes what the run computes, or a config file of another run.
  """
  saved = load_saved(workdir)
  if saved is None:
    raise ConfigError(
        f"no {CONFIG_FILE} in {os.path.abspath(workdir)}: is it a workdir "
        "that train.py wrote? (check the --workdir path)")
  bad = sorted(k for k in overrides if not is_environment_key(k))
  if bad:
    flat = flatten(saved)
    k = bad[0]
    raise ConfigError(
        f"--config.{k}={overrides[k]!r} would change what the run in "
        f"{workdir} computes (it was trained with {flat.get(k)!r}); eval.py "
        "may only change " + ", ".join(f"config.{e}" for e in
                                        ENVIRONMENT_KEYS))
  if config_given and cli is not None:
    diffs = _differences_from(saved, cli)
    if diffs:
      raise ConfigError(
          f"the --config given is not the config of the run in {workdir} ("
          + _format(diffs, "run", "--config") + "); drop --config to use "
          "the run's own")
  # Keys a newer fkjax added since the run was trained take the value that
  # reproduces how it ran (fkjax.config.history), else the config file's
  # defaults; everything the run recorded comes from its record, but the
  # environment keys of a config file the user named explicitly.
  config = (ml_collections.ConfigDict(as_dict(cli)) if cli is not None
            else ml_collections.ConfigDict(saved))
  saved = history.complete(saved, [c for c in history.CHANGES
                                   if not is_environment_key(c.key)])
  for key, value in flatten(saved).items():
    if not (config_given and is_environment_key(key)):
      config_keys.set_value(config, key, value)
  for key, value in overrides.items():
    config_keys.set_value(config, key, value)
  return config
