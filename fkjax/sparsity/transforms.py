"""RVSM and RGSM (Algorithms 1 and 2 of the paper) as optax transformations.

Both methods minimise a relaxed augmented Lagrangian
``f(w) + λ·P(u) + β/2 ‖w − u‖²`` with ``u = prox(w)`` in closed form. The ``w``
step is a gradient step on it::

    w ← w − η ∇f(w) − η β (w − u),   u = prox(w) from the current w.

In optax terms the first part is the usual optimiser (SGD with momentum in the
paper) and the second is a *splitting step* that needs ``params`` and goes last
in the chain. As in the authors' code the splitting step bypasses momentum and
weight decay: it is added to the already-scaled SGD update, with the same
learning rate schedule ``η_t`` as SGD::

    optax.chain(
        optax.add_decayed_weights(5e-4),
        optax.sgd(schedule, momentum=0.9, nesterov=True),
        rvsm(beta=5e-2, lamb=1e-6, learning_rate=schedule),
    )

RGSM adds a group-lasso term ``λ2 Σ_g ‖w_g‖₂`` to the objective, whose
(sub)gradient enters *before* SGD, and uses the group-ℓ0 prox for ``u``.
:func:`fkjax.sparsity.sparse_sgd` builds the paper's whole chain.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Union

import chex
import jax
import jax.numpy as jnp
import optax

from fkjax.sparsity import masks
from fkjax.sparsity import operators

ScalarOrSchedule = Union[float, jax.Array, optax.Schedule]
PyTree = Any


class RVSMState(NamedTuple):
  """State of :func:`rvsm`: the step count that evaluates the lr schedule."""

  count: chex.Array


class GroupL0SplitState(NamedTuple):
  """State of :func:`group_l0_split`: the step count for the lr schedule."""

  count: chex.Array


def learning_rate_at(learning_rate: ScalarOrSchedule, count: chex.Array):
  """``learning_rate(count)`` for a schedule, the constant otherwise."""
  return learning_rate(count) if callable(learning_rate) else learning_rate


def _missing_params(name: str) -> ValueError:
  return ValueError(
      f"fkjax.sparsity.{name} needs the current parameters: call "
      "`update(updates, state, params)`. It reads w to compute the sparse "
      "u = prox(w), so put it last in the chain, after SGD."
  )


def _splitting_step(
    name: str,
    state_cls: Callable[..., Any],
    prox: Callable[[jax.Array], jax.Array],
    beta: Any,
    learning_rate: ScalarOrSchedule,
) -> optax.GradientTransformation:
  """Adds ``−η_t β (w − prox(w))`` to the updates (``w`` = incoming params)."""

  def init_fn(params):
    del params
    return state_cls(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    if params is None:
      raise _missing_params(name)
    eta = learning_rate_at(learning_rate, state.count)

    def step(g, w):
      pull = eta * beta * (w - prox(w))
      return g - pull.astype(g.dtype)

    updates = jax.tree.map(step, updates, params)
    return updates, state_cls(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def rvsm(
    beta: Any,
    lamb: Any,
    learning_rate: ScalarOrSchedule,
    mask: masks.Mask = masks.CONV_KERNELS,
) -> optax.GradientTransformation:
  """RVSM splitting step (Algorithm 1): unstructured ℓ0 pruning.

  Adds ``−η_t β (w − u)`` to the updates with ``u = H_{sqrt(2λ/β)}(w)`` computed
  from the current params. Put it *last* in the chain, after the optimiser; it
  is outside momentum, like the authors' code.

  Args:
    beta: splitting weight β (> 0); may be traced (``inject_hyperparams``).
    lamb: ℓ0 weight λ; the hard threshold is ``sqrt(2λ/β)``.
    learning_rate: η, a float or an optax schedule; use SGD's schedule.
    mask: which leaves to sparsify (see :mod:`fkjax.sparsity.masks`); the
      default selects conv kernels, the others' updates pass through.

  Returns:
    An ``optax.GradientTransformation`` whose state holds an :class:`RVSMState`
    (inside ``optax.MaskedState`` when masked).
  """
  inner = _splitting_step(
      "rvsm",
      RVSMState,
      lambda w: operators.hard_threshold(w, operators.l0_threshold(lamb, beta)),
      beta,
      learning_rate,
  )
  return masks.maybe_masked(inner, mask)


def group_lasso(
    lamb2: Any,
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
) -> optax.GradientTransformation:
  """Adds the group-lasso gradient ``λ2 w_g / sqrt(‖w_g‖² + 1e-8)`` to updates.

  This is the ``λ2 ‖w‖_GL`` term of RGSM's objective; put it *before* the
  optimiser (it acts on gradients, like ``optax.add_decayed_weights``).

  Args:
    lamb2: group-lasso weight λ2; may be traced.
    group: channel grouping, ``"input"`` (default), ``"output"`` or axes.
    mask: which leaves get the penalty; default: conv kernels.
  """

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "fkjax.sparsity.group_lasso needs the current parameters: call "
          "`update(updates, state, params)`."
      )
    updates = jax.tree.map(
        lambda g, w: g + operators.group_lasso_grad(w, lamb2, group).astype(
            g.dtype
        ),
        updates,
        params,
    )
    return updates, state

  return masks.maybe_masked(
      optax.GradientTransformation(init_fn, update_fn), mask
  )


def group_l0_split(
    beta: Any,
    lamb1: Any,
    learning_rate: ScalarOrSchedule,
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
) -> optax.GradientTransformation:
  """RGSM splitting step: adds ``−η_t β (w − u)``, ``u`` = group-ℓ0 prox of w.

  A channel group of ``u`` is kept iff ``‖w_g‖₂ > sqrt(2 λ1 / β)``. Put it last
  in the chain, after the optimiser (outside momentum).

  Args:
    beta: splitting weight β (> 0); may be traced.
    lamb1: group-ℓ0 weight λ1.
    learning_rate: η, a float or an optax schedule; use SGD's schedule.
    group: channel grouping, ``"input"`` (default), ``"output"`` or axes.
    mask: which leaves to sparsify; default: conv kernels.
  """
  inner = _splitting_step(
      "group_l0_split",
      GroupL0SplitState,
      lambda w: operators.group_l0_prox(w, lamb1, beta, group),
      beta,
      learning_rate,
  )
  return masks.maybe_masked(inner, mask)


def rgsm(
    beta: Any,
    lamb1: Any,
    lamb2: Any,
    learning_rate: ScalarOrSchedule,
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
  """RGSM (Algorithm 2) as its two pieces ``(before_sgd, after_sgd)``.

  Use as ``optax.chain(before_sgd, optax.sgd(...), after_sgd)``:
  ``before_sgd`` = :func:`group_lasso` (λ2), ``after_sgd`` =
  :func:`group_l0_split` (β, λ1). ``sparse_sgd("rgsm", ...)`` builds the full
  chain.
  """
  return (
      group_lasso(lamb2, group=group, mask=mask),
      group_l0_split(beta, lamb1, learning_rate, group=group, mask=mask),
  )
