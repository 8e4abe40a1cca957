"""ADMM pruning, the baseline the paper compares RVSM and RGSM against.

Scaled-form ADMM for ``min f(w)  s.t.  w ∈ S`` (S = "at most (100 − p) % of each
layer's entries, or channels, are non-zero"), with the ``w`` step replaced by
one optimiser step, as in every DNN adaptation of ADMM. Each update, from the
current params ``w`` and the state ``(z, u)``::

    z ← Proj_S(w + u)
    u ← u + w − z
    updates += −η_t ρ (w − z + u)

The last line is the gradient of ``ρ/2 ‖w − z + u‖²``; like the RVSM splitting
step it is added after the optimiser (outside momentum), so the transformation
goes last in the chain. The paper's protocol re-initialises ``z = Proj(w)``,
``u = 0`` at every epoch: call :func:`admm_reset` at the epoch's start.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from fkjax.sparsity import masks
from fkjax.sparsity import operators
from fkjax.sparsity import transforms

PyTree = Any


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class ADMMSpec:
  """The static part of an ADMM projection (a pytree without leaves).

  Kept in :class:`ADMMState` so that :func:`admm_reset` can rebuild
  ``z = Proj(w)`` from the optimiser state alone, also under ``jax.jit``.
  """

  structure: str
  group: Any


class ADMMState(NamedTuple):
  """State of :func:`admm`.

  Attributes:
    count: step count, evaluates the learning-rate schedule.
    percent: the pruning percentage used by the last update (it may be a
      schedule under ``optax.inject_hyperparams``).
    z: the auxiliary, sparse variable ``Proj(w + u)``, shaped like the params.
    u: the scaled dual variable, shaped like the params.
    spec: structure and grouping of the projection (static, no leaves).
  """

  count: chex.Array
  percent: chex.Array
  z: PyTree
  u: PyTree
  spec: ADMMSpec


def _project_tree(tree: PyTree, percent: Any, spec: ADMMSpec) -> PyTree:
  return jax.tree.map(
      lambda w: operators.admm_projection(
          w, percent, spec.structure, spec.group
      ),
      tree,
  )


def admm(
    rho: Any,
    percent: Any,
    learning_rate: transforms.ScalarOrSchedule,
    structure: str = "element",
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
) -> optax.GradientTransformation:
  """ADMM pruning step; put it last in the chain, after the optimiser.

  Args:
    rho: ADMM penalty ρ; may be traced.
    percent: percentage of each layer's entries (``structure="element"``) or
      channel groups (``"channel"``) that ``z`` zeroes; per member for
      member-stacked kernels.
    learning_rate: η, a float or an optax schedule; use the optimiser's.
    structure: ``"element"`` or ``"channel"``.
    group: channel grouping for ``"channel"``: ``"input"``, ``"output"``, axes.
    mask: which leaves to prune; default: conv kernels.

  Returns:
    An ``optax.GradientTransformation`` with an :class:`ADMMState` (inside
    ``optax.MaskedState`` when masked).
  """
  if structure not in ("element", "channel"):
    raise ValueError(
        f"Unknown ADMM structure {structure!r}; expected 'element' or "
        "'channel'."
    )
  spec = ADMMSpec(structure=structure, group=group)

  def init_fn(params):
    return ADMMState(
        count=jnp.zeros([], jnp.int32),
        percent=jnp.asarray(percent, jnp.float32),
        z=_project_tree(params, percent, spec),
        u=jax.tree.map(jnp.zeros_like, params),
        spec=spec,
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "fkjax.sparsity.admm needs the current parameters: call "
          "`update(updates, state, params)`, with admm last in the chain."
      )
    eta = transforms.learning_rate_at(learning_rate, state.count)
    z = jax.tree.map(
        lambda w, u: operators.admm_projection(
            w + u, percent, structure, group
        ),
        params,
        state.u,
    )
    u = jax.tree.map(lambda u, w, z: u + w - z, state.u, params, z)
    updates = jax.tree.map(
        lambda g, w, z, u: g - (eta * rho * (w - z + u)).astype(g.dtype),
        updates,
        params,
        z,
        u,
    )
    new_state = ADMMState(
        count=optax.safe_increment(state.count),
        percent=jnp.asarray(percent, jnp.float32),
        z=z,
        u=u,
        spec=spec,
    )
    return updates, new_state

  return masks.maybe_masked(
      optax.GradientTransformation(init_fn, update_fn), mask
  )


def _is_masked_node(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def admm_reset(opt_state: PyTree, params: PyTree) -> PyTree:
  """Re-initialises every ADMM state in ``opt_state``: z = Proj(w), u = 0.

  Finds :class:`ADMMState` anywhere in a chained / masked /
  ``inject_hyperparams``-wrapped optax state. The paper's protocol calls this
  at the start of every epoch. Pure and jittable.

  Args:
    opt_state: an optax state containing at least one :class:`ADMMState`.
    params: the current parameters (the full tree, not masked).

  Returns:
    ``opt_state`` with the ADMM states reset; everything else untouched.

  Raises:
    ValueError: when ``opt_state`` holds no :class:`ADMMState`.
  """
  found = []

  def reset(node):
    if not isinstance(node, ADMMState):
      return node
    found.append(True)
    # z mirrors params except where optax.masked put a MaskedNode; mapping over
    # z (MaskedNodes as leaves) with params as a second tree follows that.
    z = jax.tree.map(
        lambda old, w: old
        if _is_masked_node(old)
        else operators.admm_projection(
            w, node.percent, node.spec.structure, node.spec.group
        ).astype(old.dtype),
        node.z,
        params,
        is_leaf=_is_masked_node,
    )
    u = jax.tree.map(jnp.zeros_like, node.u)
    return node._replace(z=z, u=u)

  new_state = jax.tree.map(
      reset, opt_state, is_leaf=lambda x: isinstance(x, ADMMState)
  )
  if not found:
    raise ValueError("admm_reset: no ADMMState found in the optimiser state.")
  return new_state
