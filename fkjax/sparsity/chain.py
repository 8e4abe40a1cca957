"""The paper's optimiser: SGD with the sparsifier of a method, by name."""
from __future__ import annotations

from typing import Any, Optional

import optax

from fkjax.sparsity import sparsifiers
from fkjax.sparsity import transforms


def sparse_sgd(
    method: str,
    learning_rate: transforms.ScalarOrSchedule,
    *,
    momentum: Optional[float] = 0.9,
    nesterov: bool = True,
    weight_decay: float = 5e-4,
    **method_hparams: Any,
) -> optax.GradientTransformation:
  """The paper's optimiser: weight decay, SGD with momentum, sparsifier last.

  The chain is ``add_decayed_weights(weight_decay)`` (on every parameter, as
  PyTorch's SGD does) → [``group_lasso`` for rgsm] → ``sgd(learning_rate,
  momentum, nesterov)`` → [``rvsm`` / ``group_l0_split`` / ``admm``]. The same
  as ``get_sparsifier(method, **method_hparams).optimizer(learning_rate, ...)``.

  Args:
    method: ``"none"``, ``"rvsm"``, ``"rgsm"`` or ``"admm"``.
    learning_rate: float or schedule, shared by SGD and the splitting step.
    momentum: SGD momentum (0 or None for plain SGD).
    nesterov: Nesterov momentum.
    weight_decay: L2 coefficient added to every gradient (0 disables it).
    **method_hparams: the sparsifier's arguments: rvsm ``beta, lamb``; rgsm
      ``beta, lamb1, lamb2`` [``group``]; admm ``rho, percent`` [``structure,
      group``]; all accept ``mask`` and ``layout``.

  Raises:
    ValueError: for an unknown method or an invalid value.
    TypeError: for missing or unexpected method hyperparameters.
  """
  return sparsifiers.get_sparsifier(method, **method_hparams).optimizer(
      learning_rate, momentum=momentum, nesterov=nesterov,
      weight_decay=weight_decay)
