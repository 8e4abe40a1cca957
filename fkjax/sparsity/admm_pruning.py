"""ADMM pruning, the baseline the paper compares RVSM and RGSM against.

Scaled-form ADMM for ``min f(w)  s.t.  w ∈ S`` (S = "at most (100 − p) % of each
layer's entries, or channels, are non-zero"), with the ``w`` step replaced by
one optimiser step, as in every DNN adaptation of ADMM. Each update, from the
current params ``w`` and the state ``(z, u)``::

    z ← Proj_S(w + u)
    u ← u + w − z
    updates += −η_t ρ (w − z + u)

The last line is the gradient of ``ρ/2 ‖w − z + u‖²``; like the RVSM splitting
step it is added after the optimiser (outside momentum), so the piece
:func:`admm_split` goes last in the chain (:func:`fkjax.sparsity.admm` wraps
the optimiser and puts it there). The paper's protocol re-initialises ``z = Proj(w)``,
``u = 0`` at every epoch: call :func:`admm_reset` at the epoch's start.

``variant="authors"`` follows the authors' released code instead: its
``Proj`` zeroes fewer entries (:func:`fkjax.sparsity.admm_projection`), and
its pull is added once per pruned layer for every layer (a loop over the
layers nested in another), i.e. ``L ρ (w − z + u)`` with ``L`` the number of
layers this transformation prunes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax

from fkjax.sparsity import checks
from fkjax.sparsity import layouts as layouts_lib
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
  layouts: layouts_lib.Layouts = dataclasses.field(
      default_factory=lambda: layouts_lib.normalize(None))
  variant: str = "exact"

  def __post_init__(self):
    # A spec built by hand fails here, not inside a traced update.
    operators.check_structure(self.structure)
    operators.check_group(self.group)
    operators.check_variant(self.variant)

  @property
  def need_layout(self) -> bool:
    # Only named channel groups need to know where the channel axes are.
    return self.structure == "channel" and isinstance(self.group, str)

  def project(self, who: str, tree: PyTree, percent: Any) -> PyTree:
    """``Proj`` of every leaf of ``tree``, each with its layout."""
    return layouts_lib.tree_map_with_layouts(
        who,
        lambda w, layout: operators.admm_projection(
            w, percent, self.structure, self.group, layout, self.variant),
        self.layouts,
        tree,
        need_layout=self.need_layout,
    )

  def num_layers(self, tree: PyTree) -> int:
    """The layers in ``tree`` as :meth:`project` counts them (static).

    A leaf is one layer, or one per index of its layout's stacked axes
    (``M``, ``L``, ``S``: members, scanned layers, ...). Masked-out
    ``optax.MaskedNode`` entries have no leaves and are not counted.
    """
    count = 0
    for path, w in jax.tree_util.tree_leaves_with_path(tree):
      layout = self.layouts.for_leaf(path, w)
      layers = 1
      for axis in (layout.stack_axes if layout is not None else ()):
        layers *= w.shape[axis]
      count += layers
    return count

  def pull_multiplicity(self, tree: PyTree) -> int:
    """How many times a step adds the pull ``ρ (w − z + u)``: 1, or for the
    ``"authors"`` variant :meth:`num_layers` (their nested loop)."""
    return self.num_layers(tree) if self.variant == "authors" else 1


class ADMMState(NamedTuple):
  """State of :func:`admm_split`.

  Attributes:
    count: step count, at which schedules are evaluated.
    rho: the penalty ρ used by the last update (at ``init``: step 0's).
    percent: the pruning percentage used by the last update.
    z: the auxiliary, sparse variable ``Proj(w + u)``, shaped like the params.
    u: the scaled dual variable, shaped like the params.
    spec: structure and grouping of the projection (static, no leaves).
    placement: where it goes in a chain (static).
  """

  count: chex.Array
  rho: chex.Array
  percent: chex.Array
  z: PyTree
  u: PyTree
  spec: ADMMSpec
  placement: transforms.Placement


def admm_split(
    rho: Any,
    percent: Any,
    learning_rate: Optional[transforms.ScalarOrSchedule],
    structure: str = "element",
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
    variant: str = "exact",
) -> optax.GradientTransformation:
  """ADMM pruning step; put it last in the chain, after the optimiser.

  :func:`fkjax.sparsity.admm` wraps the optimiser and puts it there.

  Args:
    rho: ADMM penalty ρ (> 0), a float or a schedule.
    percent: percentage of each layer's entries (``structure="element"``) or
      channel groups (``"channel"``) that ``z`` zeroes, in [0, 100]; per
      layer of stacked kernels (layouts ``"MHWIO"``, ``"LHWIO"``); a float or
      a schedule.
    learning_rate: η, a float or an optax schedule: use the optimiser's. Or
      None: the step adds the gradient ``+ρ (w − z + u)`` and goes before
      ``optax.scale_by_learning_rate`` (see :func:`fkjax.sparsity.l0_split`).
    structure: ``"element"`` or ``"channel"``.
    group: channel grouping for ``"channel"``: ``"input"``, ``"output"``, axes.
    mask: which leaves to prune; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).
    variant: ``"exact"`` (fkjax's: exactly ``percent`` % zeroed, the pull
      added once) or ``"authors"`` (the authors' released code: their
      projection, see :func:`fkjax.sparsity.admm_projection`, and the pull
      added ``L`` times, ``L`` the number of layers pruned, as
      :meth:`ADMMSpec.num_layers` counts them).

  Returns:
    An ``optax.GradientTransformation`` with an :class:`ADMMState` (inside
    ``optax.MaskedState`` when masked).
  """
  checks.check_hparams("admm_split", rho=rho, percent=percent,
                       learning_rate=learning_rate)
  operators.check_structure(structure)
  operators.check_group(group)
  operators.check_variant(variant)
  if not isinstance(group, str):
    group = tuple(int(a) for a in group)  # hashable: ADMMSpec is static
  spec = ADMMSpec(structure=structure, group=group,
                  layouts=layouts_lib.normalize(layout), variant=variant)
  placement = transforms.Placement(scales_itself=learning_rate is not None)

  def init_fn(params):
    count = jnp.zeros([], jnp.int32)
    p = checks.value_at(percent, count)
    return ADMMState(
        count=count,
        rho=transforms.recorded(checks.value_at(rho, count)),
        percent=transforms.recorded(p),
        z=spec.project("admm", params, p),
        u=jax.tree.map(jnp.zeros_like, params),
        spec=spec,
        placement=placement,
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "fkjax.sparsity.admm_split needs the current parameters: call "
          "`update(updates, state, params)`, with it last in the chain."
      )
    rho_t = checks.value_at(rho, state.count)
    percent_t = checks.value_at(percent, state.count)
    z = spec.project("admm", jax.tree.map(jnp.add, params, state.u),
                     percent_t)
    u = jax.tree.map(lambda u, w, z: u + w - z, state.u, params, z)
    # Shapes only: a Python int under jit.
    pull = spec.pull_multiplicity(params) * rho_t
    if learning_rate is None:  # before the lr scaling: a gradient term
      step = lambda g, w, z, u: g + (pull * (w - z + u)).astype(g.dtype)
    else:
      eta = transforms.learning_rate_at(learning_rate, state.count)
      step = lambda g, w, z, u: g - (eta * pull * (w - z + u)).astype(g.dtype)
    updates = jax.tree.map(step, updates, params, z, u)
    new_state = ADMMState(
        count=optax.safe_increment(state.count),
        rho=transforms.recorded(rho_t),
        percent=transforms.recorded(percent_t),
        z=z,
        u=u,
        spec=spec,
        placement=placement,
    )
    return updates, new_state

  return masks.maybe_masked(
      optax.GradientTransformation(init_fn, update_fn), mask, layout,
      "admm_split"
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
  by_path = {layouts_lib.path_key(p): (p, w)
             for p, w in jax.tree_util.tree_leaves_with_path(params)}

  def reset(node):
    if not isinstance(node, ADMMState):
      return node
    found.append(True)
    # z mirrors params except where optax.masked put a MaskedNode; mapping over
    # z (MaskedNodes as leaves) with params as a second tree follows that.
    spec = node.spec

    def reset_leaf(path, old):
      if _is_masked_node(old):
        return old
      if layouts_lib.path_key(path) not in by_path:
        raise ValueError(
            f"fkjax.sparsity.admm_reset: the ADMM state has "
            f"{masks.path_name(path)!r}, the params do not: pass the tree "
            "the optimiser was built on.")
      p_path, w = by_path[layouts_lib.path_key(path)]
      layout = spec.layouts.for_leaf(p_path, w)
      if layout is None and spec.need_layout:
        raise ValueError(
            f"fkjax.sparsity.admm_reset: {masks.path_name(p_path)!r} has no "
            f"layout ({spec.layouts.describe()}).")
      return operators.admm_projection(
          w, node.percent, spec.structure, spec.group, layout, spec.variant
      ).astype(old.dtype)

    # Params and z are matched by path, not by tree structure: under Flax
    # NNX the optimiser state wraps each leaf in another Variable type
    # (nnx.Optimizer's OptVariable) than the params (nnx.Param).
    z = jax.tree_util.tree_map_with_path(
        reset_leaf, node.z, is_leaf=_is_masked_node)
    u = jax.tree.map(jnp.zeros_like, node.u)
    return node._replace(z=z, u=u)

  new_state = jax.tree.map(
      reset, opt_state, is_leaf=lambda x: isinstance(x, ADMMState)
  )
  if not found:
    raise ValueError("admm_reset: no ADMMState found in the optimiser state.")
  return new_state
