"""Validation of the sparsifiers' hyperparameters: one clear error per value.

A wrong value trains without complaint and gives a silently wrong net (``β = 0``
prunes everything: the thresholds are ``sqrt(2λ/β)``), so every sparsifier
checks its values when it is built. Values that cannot be known then (traced
under ``jit``, or schedules) are not checked.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import jax
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
}


def _concrete(value: Any) -> Optional[np.ndarray]:
  """``value``'s numbers as a flat float array, or None when they are not
  known now (traced, or a schedule)."""
  if callable(value) or isinstance(value, jax.core.Tracer):
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
    value: its value, or an array of values (one per run of a sweep), each
      checked; traced values and schedules are not checked.
  """
  if name not in _RULES:
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
  for name, value in values.items():
    check_hparam(who, name, value)
