"""The pieces of RVSM and RGSM (Algorithms 1 and 2 of the paper), for experts.

Most users want the wrappers of :mod:`fkjax.sparsity.wrappers`
(``sparsity.rvsm(optax.sgd(...), beta=..., lamb=...)``), which put these
pieces around the optimiser in the one right order.

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
        l0_split(beta=5e-2, lamb=1e-6, learning_rate=schedule),
    )

The splitting step evaluates the schedule at its own step count because optax
transformations share no state; the two counts stay equal, as every
transformation of a chain is updated once per step. With
``learning_rate=None`` the step adds the gradient ``+β (w − u)`` instead and
goes between momentum and the learning-rate scaling (the same update, up to
rounding)::

    optax.chain(
        optax.add_decayed_weights(5e-4),
        optax.trace(decay=0.9, nesterov=True),
        l0_split(beta=5e-2, lamb=1e-6, learning_rate=None),
        optax.scale_by_learning_rate(schedule),
    )

RGSM adds a group-lasso term ``λ2 Σ_g ‖w_g‖₂`` to the objective, whose
(sub)gradient (:func:`group_lasso`) enters *before* SGD, and uses the
group-ℓ0 prox for ``u`` (:func:`group_l0_split`).

Every hyperparameter is a float or an optax schedule (evaluated at the
piece's step count), and each piece's state records the values its last
update used (at ``init``: step 0's), which is what
:meth:`fkjax.sparsity.Sparsifier.end_of_epoch` projects with.
"""
from __future__ import annotations

import dataclasses
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


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a splitting step goes in a chain (static: no leaves).

  Kept in its state, so that :func:`fkjax.sparsity.order.check_order` can
  tell a chain that puts it in the wrong place.

  Attributes:
    scales_itself: True when it scales its step by the learning rate (it
      goes after the optimiser); False for ``learning_rate=None`` (it goes
      between momentum and the learning-rate scaling).
  """

  scales_itself: bool


class L0SplitState(NamedTuple):
  """State of :func:`l0_split` (RVSM's splitting step).

  Attributes:
    count: the step count, at which schedules are evaluated.
    beta: β of the last update (at ``init``: step 0's).
    lamb: λ of the last update.
    placement: where it goes in a chain.
  """

  count: chex.Array
  beta: chex.Array
  lamb: chex.Array
  placement: Placement


class GroupL0SplitState(NamedTuple):
  """State of :func:`group_l0_split` (RGSM's splitting step): the step count,
  β, λ1 of the last update, and where it goes in a chain."""

  count: chex.Array
  beta: chex.Array
  lamb1: chex.Array
  placement: Placement


class GroupLassoState(NamedTuple):
  """State of :func:`group_lasso`: the step count, and λ2 of the last
  update."""

  count: chex.Array
  lamb2: chex.Array


def learning_rate_at(learning_rate: ScalarOrSchedule, count: chex.Array):
  """``learning_rate(count)`` for a schedule, the constant otherwise."""
  return checks.value_at(learning_rate, count)


def recorded(value: Any) -> jax.Array:
  """A hyperparameter's value as its state records it: a float32 scalar
  (an array of them in a sweep, one per run)."""
  return jnp.asarray(value, jnp.float32)


def _values_at(hparams: dict[str, Any], count: chex.Array) -> dict[str, Any]:
  return {k: checks.value_at(v, count) for k, v in hparams.items()}


def _missing_params(name: str) -> ValueError:
  return ValueError(
      f"fkjax.sparsity.{name} needs the current parameters: call "
      "`update(updates, state, params)`. It reads w to compute the sparse "
      "u = prox(w), so put it last in the chain, after SGD."
  )


def _splitting_step(
    name: str,
    state_cls: Callable[..., Any],
    prox: Callable[..., jax.Array],
    hparams: dict[str, Any],
    learning_rate: Optional[ScalarOrSchedule],
    layout: layouts_lib.LayoutSpec,
    need_layout: bool,
) -> optax.GradientTransformation:
  """Adds ``−η_t β (w − prox(w))`` to the updates (``w`` = incoming params).

  ``prox(w, layout, **values)`` gets each leaf's layout (None when it has
  none) and the hyperparameters' values at this step; ``hparams`` holds
  ``beta`` and the prox's weight, each a number or a schedule.
  """

  placement = Placement(scales_itself=learning_rate is not None)

  def init_fn(params):
    del params
    count = jnp.zeros([], jnp.int32)
    return state_cls(count=count, placement=placement, **{
        k: recorded(v) for k, v in _values_at(hparams, count).items()})

  def update_fn(updates, state, params=None):
    if params is None:
      raise _missing_params(name)
    values = _values_at(hparams, state.count)
    beta = values["beta"]
    eta = (None if learning_rate is None
           else learning_rate_at(learning_rate, state.count))

    def step(g, layout, w):
      # Before the lr scaling: a gradient term, +β (w − u).
      if learning_rate is None:
        return g + (beta * (w - prox(w, layout, **values))).astype(g.dtype)
      pull = eta * beta * (w - prox(w, layout, **values))
      return g - pull.astype(g.dtype)

    updates = layouts_lib.tree_map_with_layouts(
        name, step, layout, updates, params, need_layout=need_layout
    )
    return updates, state_cls(count=optax.safe_increment(state.count),
                              placement=placement,
                              **{k: recorded(v) for k, v in values.items()})

  return optax.GradientTransformation(init_fn, update_fn)


def l0_split(
    beta: Any,
    lamb: Any,
    learning_rate: Optional[ScalarOrSchedule],
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformation:
  """RVSM's splitting step (Algorithm 1): unstructured ℓ0 pruning.

  Adds ``−η_t β (w − u)`` to the updates with ``u = H_{sqrt(2λ/β)}(w)`` computed
  from the current params. Put it *last* in the chain, after the optimiser; it
  is outside momentum, like the authors' code. :func:`fkjax.sparsity.rvsm`
  puts it there for you.

  Args:
    beta: splitting weight β (> 0), a float or a schedule.
    lamb: ℓ0 weight λ (≥ 0), a float or a schedule; the hard threshold is
      ``sqrt(2λ/β)``.
    learning_rate: η, a float or an optax schedule: pass SGD's. Or None: the
      step then adds the gradient ``+β (w − u)`` and goes between
      ``optax.trace`` (momentum) and ``optax.scale_by_learning_rate``, so the
      chain holds one schedule (see ``docs/sparsity.md``).
    mask: which leaves to sparsify (see :mod:`fkjax.sparsity.masks`); the
      default selects conv kernels, the others' updates pass through.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`); they
      decide which leaves the default mask selects.

  Returns:
    An ``optax.GradientTransformation`` whose state holds an
    :class:`L0SplitState` (inside ``optax.MaskedState`` when masked).

  Raises:
    ValueError: for β ≤ 0 or λ < 0 (when known), and at ``init`` when the
      mask selects no parameter.
    TypeError: for a callable that is not a schedule.
  """
  checks.check_hparams("l0_split", beta=beta, lamb=lamb,
                       learning_rate=learning_rate)
  inner = _splitting_step(
      "l0_split",
      L0SplitState,
      lambda w, _, beta, lamb: operators.hard_threshold(
          w, operators.l0_threshold(lamb, beta)),
      {"beta": beta, "lamb": lamb},
      learning_rate,
      layout,
      need_layout=False,
  )
  return masks.maybe_masked(inner, mask, layout, "l0_split")


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
    lamb2: group-lasso weight λ2 (≥ 0), a float or a schedule.
    group: channel grouping, ``"input"`` (default), ``"output"`` or axes.
    mask: which leaves get the penalty; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).

  Returns:
    An ``optax.GradientTransformation`` whose state holds a
    :class:`GroupLassoState` (inside ``optax.MaskedState`` when masked).
  """
  checks.check_hparams("group_lasso", lamb2=lamb2)
  operators.check_group(group)

  def init_fn(params):
    del params
    count = jnp.zeros([], jnp.int32)
    return GroupLassoState(count=count,
                           lamb2=recorded(checks.value_at(lamb2, count)))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "fkjax.sparsity.group_lasso needs the current parameters: call "
          "`update(updates, state, params)`."
      )
    value = checks.value_at(lamb2, state.count)
    updates = layouts_lib.tree_map_with_layouts(
        "group_lasso",
        lambda g, layout, w: g + operators.group_lasso_grad(
            w, value, group, layout).astype(g.dtype),
        layout,
        updates,
        params,
        need_layout=isinstance(group, str),
    )
    return updates, GroupLassoState(count=optax.safe_increment(state.count),
                                    lamb2=recorded(value))

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
  in the chain, after the optimiser (outside momentum);
  :func:`fkjax.sparsity.rgsm` puts it there, with :func:`group_lasso` before.

  Args:
    beta: splitting weight β (> 0), a float or a schedule.
    lamb1: group-ℓ0 weight λ1 (≥ 0), a float or a schedule.
    learning_rate: η, a float or an optax schedule: pass SGD's; or None, as
      in :func:`l0_split`.
    group: channel grouping, ``"input"`` (default), ``"output"`` or axes.
    mask: which leaves to sparsify; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).

  Returns:
    An ``optax.GradientTransformation`` whose state holds a
    :class:`GroupL0SplitState` (inside ``optax.MaskedState`` when masked).
  """
  checks.check_hparams("group_l0_split", beta=beta, lamb1=lamb1,
                       learning_rate=learning_rate)
  operators.check_group(group)
  inner = _splitting_step(
      "group_l0_split",
      GroupL0SplitState,
      lambda w, lay, beta, lamb1: operators.group_l0_prox(
          w, lamb1, beta, group, lay),
      {"beta": beta, "lamb1": lamb1},
      learning_rate,
      layout,
      need_layout=isinstance(group, str),
  )
  return masks.maybe_masked(inner, mask, layout, "group_l0_split")
