"""The paper's optimiser: SGD with the sparsifier of a method, by name."""
from __future__ import annotations

from typing import Any, Optional

import optax

from fkjax.sparsity import layouts as layouts_lib
from fkjax.sparsity import masks
from fkjax.sparsity import operators
from fkjax.sparsity import sparsifiers
from fkjax.sparsity import transforms

Hparam = Optional[transforms.ScalarOrSchedule]


def sparse_sgd(
    method: str,
    learning_rate: transforms.ScalarOrSchedule,
    *,
    momentum: Optional[float] = 0.9,
    nesterov: bool = True,
    weight_decay: float = 5e-4,
    beta: Hparam = None,
    lamb: Hparam = None,
    lamb1: Hparam = None,
    lamb2: Hparam = None,
    rho: Hparam = None,
    percent: Hparam = None,
    structure: Optional[str] = None,
    group: Optional[operators.Group] = None,
    variant: Optional[str] = None,
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformation:
  """The paper's optimiser: weight decay, then SGD wrapped by the sparsifier.

  ``get_sparsifier(method, **hparams).optimizer(learning_rate, ...)``, with
  the method's hyperparameters as keywords (those left None are not
  passed), so that ``optax.inject_hyperparams(sparse_sgd)`` can schedule any
  of them.

  Args:
    method: ``"none"``, ``"rvsm"``, ``"rgsm"`` or ``"admm"``.
    learning_rate: float or schedule, shared by SGD and the splitting step.
    momentum: SGD momentum (0 or None for plain SGD).
    nesterov: Nesterov momentum.
    weight_decay: L2 coefficient added to every gradient (0 disables it).
    beta, lamb, lamb1, lamb2, rho, percent: the method's hyperparameters
      (rvsm ``beta, lamb``; rgsm ``beta, lamb1, lamb2``; admm ``rho,
      percent``), each a float or an optax schedule.
    structure, group, variant: the method's other settings, where it has
      them (rgsm ``group``; admm ``structure, group, variant``).
    mask, layout: which leaves, and their layouts.

  Raises:
    ValueError: for an unknown method or an invalid value.
    TypeError: for missing or unexpected method hyperparameters.
  """
  given = dict(beta=beta, lamb=lamb, lamb1=lamb1, lamb2=lamb2, rho=rho,
               percent=percent, structure=structure, group=group,
               variant=variant)
  hparams = {k: v for k, v in given.items() if v is not None}
  return sparsifiers.get_sparsifier(
      method, mask=mask, layout=layout, **hparams).optimizer(
          learning_rate, momentum=momentum, nesterov=nesterov,
          weight_decay=weight_decay)
