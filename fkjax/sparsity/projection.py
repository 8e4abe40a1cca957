"""``project``: a method's sparse ``u``, which replaces ``w`` every epoch."""
from __future__ import annotations

from typing import Any

import jax

from fkjax.sparsity import masks
from fkjax.sparsity import operators

PyTree = Any

# Hyperparameters that only the optimiser uses. They are accepted (and ignored)
# so that a loop can pass the same dict to `sparse_sgd` and `project`.
_OPTIMIZER_ONLY = {"rgsm": {"lamb2"}, "admm": {"rho"}}


def _rvsm_prox(beta, lamb):
  return lambda w: operators.hard_threshold(
      w, operators.l0_threshold(lamb, beta)
  )


def _rgsm_prox(beta, lamb1, group="input"):
  return lambda w: operators.group_l0_prox(w, lamb1, beta, group)


def _admm_prox(percent, structure="element", group="input"):
  return lambda w: operators.admm_projection(w, percent, structure, group)


_PROXES = {"rvsm": _rvsm_prox, "rgsm": _rgsm_prox, "admm": _admm_prox}


def project(
    params: PyTree,
    method: str,
    *,
    mask: masks.Mask = masks.CONV_KERNELS,
    **hparams: Any,
) -> PyTree:
  """Returns the sparse ``u`` for ``params``: the weights the paper evaluates.

  The paper replaces ``w`` by ``u`` at the end of every epoch; a training loop
  does ``params = project(params, method, **hparams)``.

  * ``"none"``: ``params`` unchanged.
  * ``"rvsm"`` (``beta, lamb``): hard threshold at ``sqrt(2 lamb / beta)``.
  * ``"rgsm"`` (``beta, lamb1``, [``group``]): group-ℓ0 prox, a channel is kept
    iff its norm is ``> sqrt(2 lamb1 / beta)``.
  * ``"admm"`` (``percent``, [``structure, group``]): zero the ``percent`` %
    smallest entries / channels of every layer.

  ``lamb2`` (rgsm) and ``rho`` (admm) are accepted and ignored, so the
  optimiser's hyperparameters can be passed as they are. Leaves outside
  ``mask`` are returned unchanged. Pure and jittable (``method`` static).

  Raises:
    ValueError: for an unknown method.
    TypeError: for missing or unexpected hyperparameters.
  """
  if method == "none":
    return params
  if method not in _PROXES:
    raise ValueError(
        f"Unknown sparsification method {method!r}; expected one of 'none', "
        "'rvsm', 'rgsm', 'admm'."
    )
  ignored = _OPTIMIZER_ONLY.get(method, set())
  prox = _PROXES[method](
      **{k: v for k, v in hparams.items() if k not in ignored}
  )
  keep = masks.resolve_mask(mask, params)
  return jax.tree.map(lambda m, w: prox(w) if m else w, keep, params)
