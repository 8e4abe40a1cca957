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

The splitting step evaluates the schedule at its own step count because optax
transformations share no state; the two counts stay equal, as every
transformation of a chain is updated once per step. To write the schedule
once, pass ``learning_rate=None`` and put the step between momentum and the
learning-rate scaling; it then adds the gradient ``+β (w − u)``, which the
chain's one schedule scales (the same update, up to rounding)::

    optax.chain(
        optax.add_decayed_weights(5e-4),
        optax.trace(decay=0.9, nesterov=True),
        rvsm(beta=5e-2, lamb=1e-6, learning_rate=None),
        optax.scale_by_learning_rate(schedule),
    )

RGSM adds a group-lasso term ``λ2 Σ_g ‖w_g‖₂`` to the objective, whose
(sub)gradient enters *before* SGD, and uses the group-ℓ0 prox for ``u``.
:func:`fkjax.sparsity.sparse_sgd` builds the paper's whole chain.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import chex
import jax
import jax.numpy as jnp
import optax

from fkjax.sparsity import checks
from fkjax.sparsity import layouts as layouts_lib
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
    prox: Callable[[jax.Array, Any], jax.Array],
    beta: Any,
    learning_rate: Optional[ScalarOrSchedule],
    layout: layouts_lib.LayoutSpec,
    need_layout: bool,
) -> optax.GradientTransformation:
  """Adds ``−η_t β (w − prox(w))`` to the updates (``w`` = incoming params).

  ``prox(w, layout)`` gets each leaf's layout (None when it has none).
  """

  def init_fn(params):
    del params
    return state_cls(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    if params is None:
      raise _missing_params(name)
    eta = (None if learning_rate is None
           else learning_rate_at(learning_rate, state.count))

    def step(g, layout, w):
      # Before the lr scaling: a gradient term, +β (w − u).
      if learning_rate is None:
        return g + (beta * (w - prox(w, layout))).astype(g.dtype)
      pull = eta * beta * (w - prox(w, layout))
      return g - pull.astype(g.dtype)

    updates = layouts_lib.tree_map_with_layouts(
        name, step, layout, updates, params, need_layout=need_layout
    )
    return updates, state_cls(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def rvsm(
    beta: Any,
    lamb: Any,
    learning_rate: Optional[ScalarOrSchedule],
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformation:
  """RVSM splitting step (Algorithm 1): unstructured ℓ0 pruning.

  Adds ``−η_t β (w − u)`` to the updates with ``u = H_{sqrt(2λ/β)}(w)`` computed
  from the current params. Put it *last* in the chain, after the optimiser; it
  is outside momentum, like the authors' code.

  Args:
    beta: splitting weight β (> 0); may be traced (``inject_hyperparams``).
    lamb: ℓ0 weight λ (≥ 0); the hard threshold is ``sqrt(2λ/β)``.
    learning_rate: η, a float or an optax schedule: pass SGD's. Or None: the
      step then adds the gradient ``+β (w − u)`` and goes between
      ``optax.trace`` (momentum) and ``optax.scale_by_learning_rate``, so the
      chain holds one schedule (see ``docs/sparsity.md``).
    mask: which leaves to sparsify (see :mod:`fkjax.sparsity.masks`); the
      default selects conv kernels, the others' updates pass through.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`); they
      decide which leaves the default mask selects.

  Returns:
    An ``optax.GradientTransformation`` whose state holds an :class:`RVSMState`
    (inside ``optax.MaskedState`` when masked).

  Raises:
    ValueError: for β ≤ 0 or λ < 0 (when known), and at ``init`` when the
      mask selects no parameter.
  """
  checks.check_hparams("rvsm", beta=beta, lamb=lamb)
  inner = _splitting_step(
      "rvsm",
      RVSMState,
      lambda w, _: operators.hard_threshold(
          w, operators.l0_threshold(lamb, beta)),
      beta,
      learning_rate,
      layout,
      need_layout=False,
  )
  return masks.maybe_masked(inner, mask, layout, "rvsm")


def group_lasso(
    lamb2: Any,
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformation:
  """Adds the group-lasso gradient ``λ2 w_g / sqrt(‖w_g‖² + 1e-8)`` to updates.

  This is the ``λ2 ‖w‖_GL`` term of RGSM's objective; put it *before* the
  optimiser (it acts on gradients, like ``optax.add_decayed_weights``).

  Args:
    lamb2: group-lasso weight λ2 (≥ 0); may be traced.
    group: channel grouping, ``"input"`` (default), ``"output"`` or axes.
    mask: which leaves get the penalty; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).
  """
  checks.check_hparams("group_lasso", lamb2=lamb2)
  operators.check_group(group)

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "fkjax.sparsity.group_lasso needs the current parameters: call "
          "`update(updates, state, params)`."
      )
    updates = layouts_lib.tree_map_with_layouts(
        "group_lasso",
        lambda g, layout, w: g + operators.group_lasso_grad(
            w, lamb2, group, layout).astype(g.dtype),
        layout,
        updates,
        params,
        need_layout=isinstance(group, str),
    )
    return updates, state

  return masks.maybe_masked(
      optax.GradientTransformation(init_fn, update_fn), mask, layout,
      "group_lasso"
  )


def group_l0_split(
    beta: Any,
    lamb1: Any,
    learning_rate: Optional[ScalarOrSchedule],
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformation:
  """RGSM splitting step: adds ``−η_t β (w − u)``, ``u`` = group-ℓ0 prox of w.

  A channel group of ``u`` is kept iff ``‖w_g‖₂ > sqrt(2 λ1 / β)``. Put it last
  in the chain, after the optimiser (outside momentum).

  Args:
    beta: splitting weight β (> 0); may be traced.
    lamb1: group-ℓ0 weight λ1 (≥ 0).
    learning_rate: η, a float or an optax schedule: pass SGD's; or None, as
      in :func:`rvsm`.
    group: channel grouping, ``"input"`` (default), ``"output"`` or axes.
    mask: which leaves to sparsify; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).
  """
  checks.check_hparams("group_l0_split", beta=beta, lamb1=lamb1)
  operators.check_group(group)
  inner = _splitting_step(
      "group_l0_split",
      GroupL0SplitState,
      lambda w, lay: operators.group_l0_prox(w, lamb1, beta, group, lay),
      beta,
      learning_rate,
      layout,
      need_layout=isinstance(group, str),
  )
  return masks.maybe_masked(inner, mask, layout, "group_l0_split")


def rgsm(
    beta: Any,
    lamb1: Any,
    lamb2: Any,
    learning_rate: Optional[ScalarOrSchedule],
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
  """RGSM (Algorithm 2) as its two pieces ``(before_sgd, after_sgd)``.

  Use as ``optax.chain(before_sgd, optax.sgd(...), after_sgd)``:
  ``before_sgd`` = :func:`group_lasso` (λ2), ``after_sgd`` =
  :func:`group_l0_split` (β, λ1). ``sparse_sgd("rgsm", ...)`` builds the full
  chain.
  """
  checks.check_hparams("rgsm", beta=beta, lamb1=lamb1, lamb2=lamb2)
  return (
      group_lasso(lamb2, group=group, mask=mask, layout=layout),
      group_l0_split(beta, lamb1, learning_rate, group=group, mask=mask,
                     layout=layout),
  )
