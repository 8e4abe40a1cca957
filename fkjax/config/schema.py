"""What every config key may hold: one table, walked by ``run_config.validate``.

Each entry pairs a dotted key with a *check*: a function of the key's value
(and the whole config, for the few rules that relate keys) that returns None
when the value is valid, else what a valid value is (``"an integer >= 1"``),
which ``validate`` says as ``config.KEY=VALUE is invalid: RULE``. A check may
also return ``(shown value, rule)`` to show the value otherwise, or raise
``ConfigError`` itself when it speaks of several keys.

The allowed names come from the modules that act on them (the data sources,
the kernels, the ADMM variants, ...), imported only when a config is checked:
importing this module imports no JAX.
"""
from __future__ import annotations

import difflib
import importlib
import math
import re
from typing import Any, Callable, Mapping, Sequence, Tuple, Union

from fkjax import environment
from fkjax.config import keys as config_keys
from fkjax.config import names as config_names


class ConfigError(ValueError):
  """A config value is invalid, or does not match the run in a workdir."""


Problem = Union[None, str, Tuple[Any, str]]
Check = Callable[[Any, Mapping[str, Any]], Problem]
Rules = Tuple[Tuple[str, Check], ...]


def _int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def integer(minimum: int = 1) -> Check:
  """An integer (not a bool) of at least ``minimum``."""
  return lambda v, _: (None if _int(v) and v >= minimum
                       else f"an integer >= {minimum}")


def number(low: float = -math.inf, high: float = math.inf, *,
           low_open: bool = False, high_open: bool = False,
           rule: str | None = None) -> Check:
  """A finite number in the interval from ``low`` to ``high``."""
  lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
  text = rule or f"a number in {lo}{low:g}, {high:g}{hi}"

  def check(v: Any, _: Any) -> Problem:
    ok = _number(v) and (v > low if low_open else v >= low) and (
        v < high if high_open else v <= high)
    return None if ok else text
  return check


def one_of(options: Sequence[Any] | Callable[[], Sequence[Any]]) -> Check:
  """One of ``options`` (or of what the callable returns, when checked)."""
  def check(v: Any, _: Any) -> Problem:
    allowed = tuple(options() if callable(options) else options)
    return None if v in allowed else f"one of {list(allowed)}"
  return check


def names_in(module: str, attribute: str) -> Callable[[], Sequence[Any]]:
  """The names ``module.attribute`` lists (a tuple, or a mapping's keys),
  read when a config is checked."""
  return lambda: tuple(getattr(importlib.import_module(module), attribute))


def optional(check: Check) -> Check:
  """``check``, or None (a placeholder left unset, or a key absent from the
  records of runs trained before it existed)."""
  return lambda v, config: None if v is None else check(v, config)


def when_present(section: str, check: Check) -> Check:
  """``check`` where the config has ``section`` (absent from old records)."""
  return lambda v, config: (None if config_keys.get(config, section) is None
                            else check(v, config))


def all_of(*checks: Check) -> Check:
  """The first problem of ``checks``, in order."""
  def check(v: Any, config: Any) -> Problem:
    for each in checks:
      problem = each(v, config)
      if problem is not None:
        return problem
    return None
  return check


# --------------------------------------------------------------------------
# Rules of their own.


def _depth(v: Any, _: Any) -> Problem:
  if _int(v) and v >= 8 and (v - 2) % 6 == 0:
    return None
  return "6n+2 with n >= 1 (8, 14, 20, 26, 32, 38, 44, 56, 110, ...)"


def _synthetic_sizes(v: Any, _: Any) -> Problem:
  if isinstance(v, (tuple, list)) and len(v) == 2 and all(
      _int(n) and n >= 1 for n in v):
    return None
  return "two integers >= 1, (train pool, test)"


def _val_size(v: Any, config: Any) -> Problem:
  """The validation split comes out of the training set: smaller than it
  (known before any data are read)."""
  if not (_int(v) and v >= 0):
    return "an integer >= 0"
  if config_keys.get(config, "dataset.source") == "synthetic":
    pool = config_keys.get(config, "dataset.synthetic_sizes")[0]
    where = "config.dataset.synthetic_sizes[0]"
  else:
    from fkjax.data import types  # pylint: disable=import-outside-toplevel
    pool = types.OFFICIAL_TRAIN_SIZE
    where = (f"the official {config_keys.get(config, 'dataset.name')} "
             "training set")
  if v < pool:
    return None
  return (f"the validation split is taken out of the {pool:,} training "
          f"images ({where}): it must be smaller, in [0, {pool:,})")


def _training_pool(config: Any) -> tuple[int, str]:
  """The most training images a run can have, and what says so: the pool
  (synthetic, or the official training set) less the validation split (a
  subset per class leaves fewer still, known only once the data are read)."""
  if config_keys.get(config, "dataset.source") == "synthetic":
    pool = config_keys.get(config, "dataset.synthetic_sizes")[0]
    where = "config.dataset.synthetic_sizes[0]"
  else:
    from fkjax.data import types  # pylint: disable=import-outside-toplevel
    pool = types.OFFICIAL_TRAIN_SIZE
    where = f"the official {config_keys.get(config, 'dataset.name')} set"
  val = config_keys.get(config, "dataset.val_size")
  return pool - val, f"{pool:,} ({where}) less config.dataset.val_size={val:,}"


def _training_batch(v: Any, config: Any) -> Problem:
  """A batch no larger than the training split: an epoch needs one."""
  if not (_int(v) and v >= 1):
    return "an integer >= 1"
  n, why = _training_pool(config)
  if v <= n:
    return None
  return (f"it exceeds the {n:,} training examples ({why}): an epoch "
          f"would hold no batch; choose at most {n:,}")


def _lr_boundaries(v: Any, _: Any) -> Problem:
  boundaries = list(v or ())
  if all(_int(b) and b >= 1 for b in boundaries) and (
      boundaries == sorted(boundaries)):
    return None
  return tuple(boundaries), "increasing epoch numbers >= 1"


def _needs_attack_steps(v: Any, config: Any) -> Problem:
  if v != "pgd" or config_keys.get(config, "validation.attack_steps", 0) > 0:
    return None
  return ("selecting by PGD accuracy needs config.validation.attack_steps "
          "> 0")


def _protocol(v: Any, _: Any) -> Problem:
  if not (isinstance(v, str)
          and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", v) is not None):
    return ("'paper', 'strong', or a name of letters and digits for a "
            "further paper-protocol evaluation kept in its own file "
            "(eval_<name>.json)")
  # Any other name runs the paper's attacks: a misspelt "strong" would spend
  # an evaluation on the wrong protocol without a word.
  for named in ("paper", "strong"):
    if v != named and difflib.SequenceMatcher(
        None, v.lower(), named).ratio() >= 0.8:
      return (f"too close to {named!r} to be a further paper-protocol "
              f"evaluation's name: {named!r} for that protocol, else a name "
              "further from it")
  return None


def attack_list(known: Sequence[str], *, empty: bool = True) -> Check:
  """A comma-separated list of attack names out of ``known`` (none at all
  only where ``empty``)."""
  def check(v: Any, _: Any) -> Problem:
    names = [n.strip() for n in str(v or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if not names and not empty:
      return f"at least one attack, of {list(known)}"
    if not unknown:
      return None
    return f"unknown attack(s) {unknown}; choose from {list(known)}"
  return check


def rules(attack_names: Sequence[str]) -> Rules:
  """Every key's check, in the order ``validate`` applies them (the first
  problem is the one said).

  A key appears once, but for the two rules that relate keys
  (``dataset.val_size`` reads the data source, ``validation.select_by``
  the validation attack) and the sections checked as a whole (``kernels``,
  ``sparsity``: see :func:`kernel_choices`, :func:`sparsifier`).
  """
  return (
      (("seed", integer(0)),)   # numpy's generators refuse negative seeds
      + _dataset_rules() + _model_rules() + _training_rules()
      + _attack_rules() + _validation_rules()
      + _eval_rules(tuple(attack_names))
      + (("num_devices", integer(0)),)
      # Last, the keys whose names live in modules that import JAX: a mistake
      # elsewhere is said before JAX loads (seconds).
      + _jax_named_rules())


def _dataset_rules() -> Rules:
  """``config.dataset``: names from the data package, sizes, seeds."""
  return (
      ("dataset.name", one_of(lambda: sorted(
          {name for name, _ in names_in("fkjax.data.types",
                                        "NUM_CLASSES")()}))),
      ("dataset.source", one_of(names_in("fkjax.data.sources", "SOURCES"))),
      ("dataset.split_seed", integer(0)),
      ("dataset.synthetic_sizes", _synthetic_sizes),
      ("dataset.val_size", _val_size),
      ("dataset.subset_per_class", optional(integer())),
      ("dataset.test_subset_per_class", optional(integer())),
  )


def _model_rules() -> Rules:
  """``config.model``: the architecture and its noise."""
  return (
      ("model.depth", _depth),
      ("model.ensemble_size", integer()),
      ("model.width", integer()),
      ("model.noise_coef", number(0.0)),
      ("model.noise_std_over", one_of(("batch", "example"))),
  )


def _training_rules() -> Rules:
  """``config.training`` but its data pipeline (named in a JAX module): the
  schedule, the optimizer, checkpoints, the divergence guard."""
  return (
      ("training.num_epochs", integer()),
      ("training.batch_size", _training_batch),
      ("training.learning_rate", number(0.0, low_open=True)),
      ("training.lr_decay", number(0.0, low_open=True)),
      ("training.lr_boundaries", _lr_boundaries),
      ("training.momentum", number(0.0, 1.0, high_open=True)),
      ("training.weight_decay", number(0.0)),
      ("training.checkpoint_every_steps", integer(0)),
      ("training.data_seed", optional(integer(0))),
      ("training.max_loss", optional(number(0.0, low_open=True))),
      ("training.steps_per_dispatch", optional(integer(0))),
      # Its name here, its hyperparameters with the sparsifier (below).
      ("sparsity.method", one_of(config_names.SPARSITY_METHODS)),
  )


def _attack_rules() -> Rules:
  """``config.attack``: the training attack."""
  return (
      ("attack.epsilon", number(
          0.0, 1.0, low_open=True,
          rule="a radius in (0, 1]: images live in [0, 1], so 8/255 means "
               "8/255 (0.0314), not 8")),
      ("attack.step_size", number(0.0, 1.0, low_open=True)),
      ("attack.num_steps", integer(0)),
      ("attack.bn_mode", one_of(("update", "train", "eval"))),
      ("attack.unroll", integer()),
  )


def _validation_rules() -> Rules:
  """``config.validation``: the per-epoch check that selects the best
  checkpoint."""
  return (
      ("validation.batch_size", integer()),
      ("validation.num_examples", integer(0)),
      ("validation.attack_steps", integer(0)),
      ("validation.select_by", one_of(("natural", "pgd"))),
      ("validation.split", one_of(("val", "test"))),
      ("validation.select_by", _needs_attack_steps),
  )


def _eval_rules(known: tuple[str, ...]) -> Rules:
  """``config.eval`` but the NAttack variant (named in a JAX module): the
  protocol, the strong protocol's budget, sizes, the attack lists."""
  strong = lambda check: when_present("eval.strong", check)
  return (
      ("eval.checkpoint", one_of(("best", "latest"))),
      ("eval.protocol", _protocol),
      ("eval.strong.eot_samples", strong(integer(0))),
      ("eval.strong.num_iters", strong(integer())),
      ("eval.strong.n_restarts", strong(integer())),
      ("eval.strong.num_seeds", strong(integer())),
      ("eval.strong.sanity_examples", strong(integer(0))),
      ("eval.batch_size", integer()),
      ("eval.num_examples", integer(0)),
      ("eval.eot_samples", integer()),
      ("eval.num_noise_draws", integer()),
      ("eval.nattack_iters", integer()),
      ("eval.nattack_population", integer()),
      # 0: as many as the device's memory holds
      # (fkjax.attacks.population_chunk's auto_chunk); a negative one failed
      # deep inside JAX.
      ("eval.nattack_chunk", optional(integer(0))),
      ("eval.nattack_image_chunk", optional(integer())),
      # eval.py evaluates something; train.py's final_attacks may be empty
      # (no final evaluation).
      ("eval.attacks", attack_list(known, empty=False)),
      ("eval.final_attacks", attack_list(known)),
  )


def _jax_named_rules() -> Rules:
  """The keys whose allowed names live in modules that import JAX (read
  only when checked), and the sections checked as a whole."""
  return (
      ("kernels", kernel_choices),
      ("training.data_pipeline",
       optional(one_of(names_in("fkjax.training.input_pipeline", "PIPELINES")))),
      ("precision", optional(one_of(names_in("fkjax.training.precision",
                                             "PRECISIONS")))),
      # Checked whatever the method: the authors preset sets it for every
      # run.
      ("sparsity.admm_variant", optional(one_of(
          names_in("fkjax.sparsity.operators", "ADMM_VARIANTS")))),
      ("sparsity", sparsifier),
      ("eval.nattack_variant", optional(one_of(
          names_in("fkjax.attacks.nattack", "VARIANTS")))),
  )


def kernel_choices(section: Any, _: Any) -> Problem:
  """``config.kernels.*``: ``"auto"`` or one of the kernels that
  :mod:`fkjax.kernels.selection` offers for each (absent from old records).
  """
  if section is None:
    return None
  # pylint: disable=import-outside-toplevel
  from fkjax.kernels import platforms
  from fkjax.kernels import selection
  # Set by the user, the platform is known without starting JAX's backend
  # (which must wait for fkjax's XLA flags).
  forced = environment.text(platforms.PLATFORM_ENV).lower()
  for key, options in selection.CHOICES.items():
    value = config_keys.get(section, key)
    problem = one_of(("auto", *options))(value, None)
    if problem is not None:
      raise invalid("kernels." + key, value, problem)
    if forced not in ("", "cpu") and value in selection.CPU_ONLY.get(key, ()):
      raise invalid("kernels." + key, value,
                    f"it runs on CPUs only, and {platforms.PLATFORM_ENV}="
                    f"{forced} asks for the {forced}'s selections: 'auto' or "
                    f"{selection.ACCELERATOR_CHOICES[key]!r}")
  return None


def sparsifier(section: Any, _: Any) -> Problem:
  """``config.sparsity``: the sparsifier itself knows its hyperparameters
  and their ranges."""
  from fkjax import sparsity  # pylint: disable=import-outside-toplevel
  try:
    sparsity.from_config(section)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.sparsity (method {section.get('method')!r}"
                      f"): {e}") from e
  return None


def invalid(key: str, value: Any, rule: str) -> Exception:
  """The error that says ``config.KEY=VALUE`` breaks ``rule``."""
  return ConfigError(f"config.{key}={value!r} is invalid: {rule}")
