"""Validation of the sparsifiers' hyperparameters: one clear error per value.

A wrong value trains without complaint and gives a silently wrong net (``β = 0``
prunes everything: the thresholds are ``sqrt(2λ/β)``), so every sparsifier
checks its values when it is built. A hyperparameter is a number or an optax
schedule (a function of the step count): a schedule is checked at step 0, and
a callable that is not a schedule is refused then. Values traced under
``jit`` (a sweep's, or ``optax.inject_hyperparams``') are not checked.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

# name -> (lower, lower inclusive, upper, upper inclusive, why).
_RULES = {
    "beta": (0.0, False, math.inf, False,
             "the splitting weight; the thresholds are sqrt(2 lamb / beta)"),
    "lamb": (0.0, True, math.inf, False, "the l0 weight"),
    "lamb1": (0.0, True, math.inf, False, "the group-l0 weight"),
    "lamb2": (0.0, True, math.inf, False, "the group-lasso weight"),
    "rho": (0.0, False, math.inf, False, "the ADMM penalty"),
    "percent": (0.0, True, 100.0, True,
                "the percentage of each layer that ADMM prunes"),
    "learning_rate": (0.0, True, math.inf, False, "the step size"),
}


def value_at(value: Any, count: Any) -> Any:
  """A hyperparameter's value at step ``count``: ``value(count)`` for a
  schedule, ``value`` itself otherwise (a Python float stays one, so a fixed
  value computes exactly as it did before schedules were accepted)."""
  return value(count) if callable(value) else value


def _at_step_zero(value: Any) -> Any:
  """A schedule's value at step 0; TypeError when ``value`` is no schedule."""
  try:
    out = value(jnp.zeros([], jnp.int32))
  except Exception as e:  # any failure says the same: not a schedule
    raise TypeError(
        f"is the callable {getattr(value, '__name__', value)!r}, which is "
        f"not an optax schedule (step -> number): calling it at step 0 "
        f"raised {type(e).__name__}: {e}") from None
  if isinstance(out, jax.core.Tracer):
    return None
  if np.ndim(out) != 0:
    raise TypeError(
        f"is a schedule whose value at step 0 has shape {np.shape(out)}; a "
        "schedule gives one number per step")
  return out


def _concrete(value: Any) -> Optional[np.ndarray]:
  """``value``'s numbers as a flat float array (a schedule's at step 0), or
  None when they are not known now (traced)."""
  if callable(value):
    value = _at_step_zero(value)
  if value is None or isinstance(value, jax.core.Tracer):
    return None
  arr = np.asarray(value)
  if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
    raise TypeError(f"expected a real number, got {value!r}")
  return arr.astype(np.float64).reshape(-1)


def valid_range(name: str) -> str:
  lo, lo_in, hi, hi_in, _ = _RULES[name]
  return (("[" if lo_in else "(") + f"{lo:g}, "
          + ("inf" if math.isinf(hi) else f"{hi:g}") + ("]" if hi_in else ")"))


def check_hparam(who: str, name: str, value: Any) -> None:
  """Raises ValueError naming ``name``, ``value`` and the valid range.

  Args:
    who: the sparsifier, for the message (e.g. ``"rgsm"``).
    name: a hyperparameter with a rule (beta, lamb, lamb1, lamb2, rho,
      percent); other names are not checked.
    value: its value, an array of values (one per run of a sweep), each
      checked, or an optax schedule, checked at step 0; traced values are
      not checked.

  Raises:
    ValueError: for a value out of range.
    TypeError: for a value that is no real number, or a callable that is no
      schedule.
  """
  if name not in _RULES or value is None:
    return
  try:
    xs = _concrete(value)
  except TypeError as e:
    raise TypeError(f"fkjax.sparsity {who}: {name} {e}") from None
  if xs is None:
    return
  lo, lo_in, hi, hi_in, why = _RULES[name]
  for i, x in enumerate(xs):
    ok = (lo <= x if lo_in else lo < x) and (x <= hi if hi_in else x < hi)
    if not ok:  # also catches NaN, for which every comparison is False
      where = f"[{i}]" if xs.size > 1 or np.ndim(value) else ""
      raise ValueError(
          f"fkjax.sparsity {who}: {name}{where}={float(x)!r} is out of range; "
          f"valid range {name} in {valid_range(name)} ({why})."
      )


def check_hparams(who: str, **values: Any) -> None:
  """:func:`check_hparam` of every ``name=value``."""
  for name, value in values.items():
    check_hparam(who, name, value)


def check_number(who: str, name: str, value: Any) -> None:
  """Raises TypeError, in one line, for a callable where a number is needed
  (e.g. a projection with no optimiser state to read a schedule's value
  from)."""
  if callable(value):
    raise TypeError(
        f"fkjax.sparsity {who}: {name} is a schedule, and this needs the "
        f"number in force: pass the optimiser state (opt_state=...), whose "
        f"sparsifier state records the value of the last step, or a number.")
