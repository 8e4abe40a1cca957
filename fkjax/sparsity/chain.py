"""The paper's optimiser: SGD with the sparsifier of a method, by name."""
from __future__ import annotations

from typing import Any

import optax

from fkjax.sparsity import admm_pruning
from fkjax.sparsity import transforms


def sparse_sgd(
    method: str,
    learning_rate: transforms.ScalarOrSchedule,
    *,
    momentum: float = 0.9,
    nesterov: bool = True,
    weight_decay: float = 5e-4,
    **method_hparams: Any,
) -> optax.GradientTransformation:
  """The paper's optimiser: weight decay, SGD with momentum, sparsifier last.

  The chain is ``add_decayed_weights(weight_decay)`` (on every parameter, as
  PyTorch's SGD does) → [``group_lasso`` for rgsm] → ``sgd(learning_rate,
  momentum, nesterov)`` → [``rvsm`` / ``group_l0_split`` / ``admm``].

  Args:
    method: ``"none"``, ``"rvsm"``, ``"rgsm"`` or ``"admm"``.
    learning_rate: float or schedule, shared by SGD and the splitting step.
    momentum: SGD momentum (0 or None for plain SGD).
    nesterov: Nesterov momentum.
    weight_decay: L2 coefficient added to every gradient (0 disables it).
    **method_hparams: the sparsifier's arguments: rvsm ``beta, lamb``; rgsm
      ``beta, lamb1, lamb2`` [``group``]; admm ``rho, percent`` [``structure,
      group``]; all accept ``mask``.

  Raises:
    ValueError: for an unknown method.
    TypeError: for missing or unexpected method hyperparameters.
  """
  before, after = [], []
  if method == "none":
    if method_hparams:
      raise TypeError(
          "method 'none' takes no hyperparameters, got "
          f"{sorted(method_hparams)}"
      )
  elif method == "rvsm":
    after.append(transforms.rvsm(learning_rate=learning_rate, **method_hparams))
  elif method == "rgsm":
    pre, post = transforms.rgsm(learning_rate=learning_rate, **method_hparams)
    before.append(pre)
    after.append(post)
  elif method == "admm":
    after.append(
        admm_pruning.admm(learning_rate=learning_rate, **method_hparams)
    )
  else:
    raise ValueError(
        f"Unknown sparsification method {method!r}; expected one of 'none', "
        "'rvsm', 'rgsm', 'admm'."
    )
  decay = [optax.add_decayed_weights(weight_decay)] if weight_decay else []
  sgd = optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov)
  return optax.chain(*decay, *before, sgd, *after)
