"""``project``: a method's sparse ``u``, which replaces ``w`` every epoch."""
from __future__ import annotations

from typing import Any

from fkjax.sparsity import layouts as layouts_lib
from fkjax.sparsity import masks
from fkjax.sparsity import sparsifiers

PyTree = Any


def project(
    params: PyTree,
    method: str,
    *,
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
    opt_state: Any = None,
    **hparams: Any,
) -> PyTree:
  """Returns the sparse ``u`` for ``params``: the weights the paper evaluates.

  The paper replaces ``w`` by ``u`` at the end of every epoch; a training loop
  does ``params = project(params, method, **hparams)``. The same as
  ``get_sparsifier(method, mask=mask, layout=layout, **hparams)``
  ``.project(params, opt_state)``: with ``opt_state`` (the optimiser's), the
  hyperparameters its last update used (schedules, ``inject_hyperparams``);
  without, the numbers given.

  * ``"none"``: ``params`` unchanged.
  * ``"rvsm"`` (``beta, lamb``): hard threshold at ``sqrt(2 lamb / beta)``.
  * ``"rgsm"`` (``beta, lamb1``, [``group``]): group-ℓ0 prox, a channel is kept
    iff its norm is ``> sqrt(2 lamb1 / beta)``.
  * ``"admm"`` (``percent``, [``structure, group, variant``]): zero the
    ``percent`` % smallest entries / channels of every layer (``variant=
    "authors"``: the authors' rules, which zero fewer).

  ``lamb2`` (rgsm) and ``rho`` (admm) are only the optimiser's: they may be
  passed (so the optimiser's hyperparameters can be passed as they are) or
  left out. Leaves outside ``mask`` are returned unchanged. Pure and jittable
  (``method`` static).

  Raises:
    ValueError: for an unknown method, an invalid value, or a mask that
      selects nothing.
    TypeError: for missing or unexpected hyperparameters, or a schedule
      without ``opt_state``.
  """
  return sparsifiers.get_sparsifier(
      method, mask=mask, layout=layout, **hparams).project(params, opt_state)
