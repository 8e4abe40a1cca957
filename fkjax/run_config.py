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

import difflib
import json
import math
import os
import re
import tempfile
from typing import Any, Iterable, Mapping

import ml_collections

CONFIG_FILE = "config.json"

# Keys (a section name covers the whole section) that say how or where a run
# is executed or evaluated, not what it trains: they may differ between the
# command that trained a run and one that resumes or evaluates it.
ENVIRONMENT_KEYS: tuple[str, ...] = (
    "eval", "kernels", "progress", "compilation_cache_dir", "num_devices",
    "dataset.data_dir", "dataset.tfds_data_dir", "dataset.download",
    "training.checkpoint_every_steps", "validation.batch_size",
    "training.data_pipeline", "training.steps_per_dispatch",
)


class ConfigError(ValueError):
  """A config value is invalid, or does not match the run in a workdir."""


# --------------------------------------------------------------------------
# Validation.

from fkjax.eval_names import ATTACK_NAMES as _ATTACK_NAMES  # pylint: disable=wrong-import-position


def _get(config: ml_collections.ConfigDict, dotted: str, default: Any = None
         ) -> Any:
  node: Any = config
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or \
        part not in node:
      return default
    node = node[part]
  return node


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
  if not ok:
    raise ConfigError(f"config.{key}={value!r} is invalid: {rule}")


def _int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def validate(config: ml_collections.ConfigDict,
             attack_names: Iterable[str] = _ATTACK_NAMES) -> None:
  """Raises :class:`ConfigError` for the first invalid value of ``config``.

  Checks every value whose mistake would otherwise surface late (after the
  data are loaded or a step compiled) or not at all (a silently wrong run):
  sizes and counts, depth ``6n+2``, the attack radius in ``(0, 1]`` (images
  live in ``[0, 1]``: 8/255, not 8), the learning-rate schedule, the
  sparsifier's hyperparameters, the attack and checkpoint names.
  """
  def positive_int(key, minimum=1):
    v = _get(config, key)
    _require(_int(v) and v >= minimum, key, v, f"an integer >= {minimum}")

  def number(key, low=-math.inf, high=math.inf, low_open=False,
             high_open=False, rule=None):
    v = _get(config, key)
    ok = _number(v) and (v > low if low_open else v >= low) and (
        v < high if high_open else v <= high)
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    _require(ok, key, v, rule or f"a number in {lo}{low:g}, {high:g}{hi}")

  def choice(key, options):
    v = _get(config, key)
    _require(v in options, key, v, f"one of {list(options)}")

  positive_int("seed", 0)   # numpy's generators refuse negative seeds
  choice("dataset.name", ("cifar10", "cifar100"))
  choice("dataset.source", ("cifar_binary", "tfds", "synthetic"))
  positive_int("dataset.split_seed", 0)
  _validate_dataset_sizes(config)
  for key in ("dataset.subset_per_class", "dataset.test_subset_per_class"):
    if _get(config, key) is not None:
      positive_int(key)

  depth = _get(config, "model.depth")
  _require(_int(depth) and depth >= 8 and (depth - 2) % 6 == 0, "model.depth",
           depth, "6n+2 with n >= 1 (8, 14, 20, 26, 32, 38, 44, 56, 110, ...)")
  positive_int("model.ensemble_size")
  positive_int("model.width")
  number("model.noise_coef", 0.0)
  choice("model.noise_std_over", ("batch", "example"))
  if _get(config, "kernels") is not None:
    from fkjax.kernels import selection  # pylint: disable=import-outside-toplevel
    for key, options in selection.CHOICES.items():
      choice("kernels." + key, ("auto", *options))

  t = "training."
  positive_int(t + "num_epochs")
  positive_int(t + "batch_size")
  number(t + "learning_rate", 0.0, low_open=True)
  number(t + "lr_decay", 0.0, low_open=True)
  boundaries = list(_get(config, t + "lr_boundaries") or ())
  _require(all(_int(b) and b >= 1 for b in boundaries)
           and boundaries == sorted(boundaries), t + "lr_boundaries",
           tuple(boundaries), "increasing epoch numbers >= 1")
  number(t + "momentum", 0.0, 1.0, high_open=True)
  number(t + "weight_decay", 0.0)
  positive_int(t + "checkpoint_every_steps", 0)
  if _get(config, t + "data_seed") is not None:
    positive_int(t + "data_seed", 0)
  if _get(config, t + "max_loss") is not None:
    number(t + "max_loss", 0.0, low_open=True)
  # Absent from the records of runs trained before they existed.
  if _get(config, t + "data_pipeline") is not None:
    choice(t + "data_pipeline", ("auto", "host", "device"))
  if _get(config, t + "steps_per_dispatch") is not None:
    positive_int(t + "steps_per_dispatch", 0)
  if _get(config, "precision") is not None:
    choice("precision", ("float32", "bfloat16"))

  number("attack.epsilon", 0.0, 1.0, low_open=True,
         rule="a radius in (0, 1]: images live in [0, 1], so 8/255 means "
              "8/255 (0.0314), not 8")
  number("attack.step_size", 0.0, 1.0, low_open=True)
  positive_int("attack.num_steps", 0)
  choice("attack.bn_mode", ("update", "train", "eval"))
  positive_int("attack.unroll")

  if _get(config, "sparsity.admm_variant") is not None:
    # Checked whatever the method: the authors preset sets it for every run.
    from fkjax.sparsity import operators  # pylint: disable=import-outside-toplevel
    choice("sparsity.admm_variant", operators.ADMM_VARIANTS)
  _validate_sparsity(config)

  positive_int("validation.batch_size")
  positive_int("validation.num_examples", 0)
  positive_int("validation.attack_steps", 0)
  choice("validation.select_by", ("natural", "pgd"))
  choice("validation.split", ("val", "test"))
  if _get(config, "validation.select_by") == "pgd":
    _require(_get(config, "validation.attack_steps", 0) > 0,
             "validation.select_by", "pgd",
             "selecting by PGD accuracy needs config.validation.attack_steps "
             "> 0")

  choice("eval.checkpoint", ("best", "latest"))
  protocol = _get(config, "eval.protocol")
  _require(isinstance(protocol, str)
           and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", protocol) is not None,
           "eval.protocol", protocol,
           "'paper', 'strong', or a name of letters and digits for a "
           "further paper-protocol evaluation kept in its own file "
           "(eval_<name>.json)")
  # Any other name runs the paper's attacks: a misspelt "strong" would spend
  # an evaluation on the wrong protocol without a word.
  for named in ("paper", "strong"):
    _require(protocol == named or difflib.SequenceMatcher(
        None, protocol.lower(), named).ratio() < 0.8,
             "eval.protocol", protocol,
             f"too close to {named!r} to be a further paper-protocol "
             f"evaluation's name: {named!r} for that protocol, else a name "
             "further from it")
  if _get(config, "eval.nattack_variant") is not None:
    choice("eval.nattack_variant", ("paper", "attackbox"))
  if _get(config, "eval.strong") is not None:
    positive_int("eval.strong.eot_samples", 0)
    positive_int("eval.strong.num_iters")
    positive_int("eval.strong.n_restarts")
    positive_int("eval.strong.num_seeds")
    positive_int("eval.strong.sanity_examples", 0)
  positive_int("eval.batch_size")
  positive_int("eval.num_examples", 0)
  positive_int("eval.eot_samples")
  positive_int("eval.num_noise_draws")
  positive_int("eval.nattack_iters")
  positive_int("eval.nattack_population")
  # A chunk of 0 never advanced (NAttack ran forever), a negative one
  # failed deep inside JAX.
  for key in ("eval.nattack_chunk", "eval.nattack_image_chunk"):
    if _get(config, key) is not None:
      positive_int(key)
  known = tuple(attack_names)
  for key in ("eval.attacks", "eval.final_attacks"):
    names = [n.strip() for n in str(_get(config, key) or "").split(",")
             if n.strip()]
    unknown = [n for n in names if n not in known]
    _require(not unknown, key, _get(config, key),
             f"unknown attack(s) {unknown}; choose from {list(known)}")
  positive_int("num_devices", 0)


def _validate_dataset_sizes(config: ml_collections.ConfigDict) -> None:
  """The synthetic sizes, and a validation split smaller than the training
  set it is taken from (known before any data are read)."""
  sizes = _get(config, "dataset.synthetic_sizes")
  _require(isinstance(sizes, (tuple, list)) and len(sizes) == 2
           and all(_int(n) and n >= 1 for n in sizes),
           "dataset.synthetic_sizes", sizes,
           "two integers >= 1, (train pool, test)")
  val_size = _get(config, "dataset.val_size")
  _require(_int(val_size) and val_size >= 0, "dataset.val_size", val_size,
           "an integer >= 0")
  if _get(config, "dataset.source") == "synthetic":
    pool, where = sizes[0], "config.dataset.synthetic_sizes[0]"
  else:
    from fkjax.data import types  # pylint: disable=import-outside-toplevel
    pool = types.OFFICIAL_TRAIN_SIZE
    where = f"the official {_get(config, 'dataset.name')} training set"
  _require(val_size < pool, "dataset.val_size", val_size,
           f"the validation split is taken out of the {pool:,} training "
           f"images ({where}): it must be smaller, in [0, {pool:,})")


def _validate_sparsity(config: ml_collections.ConfigDict) -> None:
  # The sparsifier itself knows its hyperparameters and their ranges.
  from fkjax import sparsity  # pylint: disable=import-outside-toplevel
  try:
    sparsity.from_config(config.sparsity)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.sparsity (method {config.sparsity.get('method')!r}"
                      f"): {e}") from e


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
  return any(key == k or key.startswith(k + ".") for k in ENVIRONMENT_KEYS)


def differences(a: Mapping[str, Any], b: Mapping[str, Any],
                *, ignore_environment: bool = True
                ) -> list[tuple[str, Any, Any]]:
  """``(key, a's value, b's value)`` for every key where two configs differ.

  ``a`` is the saved record: keys it lacks (added to fkjax after the run was
  trained) are not differences.
  """
  fa, fb = flatten(a), flatten(b)
  missing = object()
  out = []
  for key in sorted(set(fa) | set(fb)):
    if ignore_environment and is_environment_key(key):
      continue
    va, vb = fa.get(key, missing), fb.get(key, missing)
    if va is not missing and va != vb:
      out.append((key, None if va is missing else va,
                  None if vb is missing else vb))
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
  """The saved ``config.json`` of ``workdir`` as plain data, or None."""
  path = config_path(workdir)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path} is unreadable ({e}); it records the run's "
                      "config: restore it or use a new workdir") from e


def save(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes ``config.json`` atomically (a kill never leaves half a file)."""
  os.makedirs(workdir, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".config.", dir=workdir)
  with os.fdopen(fd, "w") as f:
    json.dump(as_dict(config), f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(tmp, config_path(workdir))


def check_same_run(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses to resume the run in ``workdir`` with a different config.

  Only :data:`ENVIRONMENT_KEYS` may differ: a different batch size, schedule
  or model would silently change what the resumed run trains.
  """
  saved = load_saved(workdir)
  if saved is None:
    return
  diffs = differences(saved, as_dict(config))
  if diffs:
    raise ConfigError(
        f"{workdir} holds a run with another config ("
        + _format(diffs, "saved", "now") + "); rerun with the run's config "
        "(eval.py reads it from the workdir) or use a new workdir")


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
    diffs = differences(saved, as_dict(cli))
    if diffs:
      raise ConfigError(
          f"the --config given is not the config of the run in {workdir} ("
          + _format(diffs, "run", "--config") + "); drop --config to use "
          "the run's own")
  # Keys a newer fkjax added since the run was trained keep the config
  # file's defaults; everything the run recorded comes from its record, but
  # the environment keys of a config file the user named explicitly.
  config = (ml_collections.ConfigDict(as_dict(cli)) if cli is not None
            else ml_collections.ConfigDict(saved))
  for key, value in flatten(saved).items():
    if not (config_given and is_environment_key(key)):
      _set(config, key, value)
  for key, value in overrides.items():
    _set(config, key, value)
  return config


def _set(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  parts = dotted.split(".")
  node = config
  for part in parts[:-1]:
    if part not in node:
      node[part] = ml_collections.ConfigDict()
    node = node[part]
  with node.ignore_type():
    node[parts[-1]] = value
