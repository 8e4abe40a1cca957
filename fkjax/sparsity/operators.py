"""Proximal and projection operators behind RVSM, RGSM and ADMM.

Every function here acts on one array, is pure and jittable, and accepts traced
hyperparameters (so the transformations built on top of them work with
``optax.inject_hyperparams``).

Channel groups follow the kernel's layout (:mod:`fkjax.sparsity.layouts`),
Flax's ``"HWIO"`` by default. The stacked axes of a layout (``M``, ``L``,
``S``: an ensemble's members in ``"MHWIO"``, scanned layers in ``"LHWIO"``)
index separate groups and separate layers: they are never folded together.
Nothing is inferred from the rank.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp

from fkjax.sparsity import layouts as layouts_lib

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

# A channel grouping: "input" (one group per input channel, the default of the
# authors' code), "output" (one group per filter), or explicit axes to reduce.
Group = Union[str, Sequence[int]]

# Numerical floor inside the group-lasso subgradient, as in the paper's code;
# it makes the subgradient of an all-zero group exactly zero.
GROUP_LASSO_EPS = 1e-8

GROUP_NAMES = ("input", "output")


def check_group(group: Group) -> None:
  """Raises ValueError unless ``group`` is a group name or a tuple of ints."""
  if isinstance(group, str):
    if group not in GROUP_NAMES:
      raise ValueError(
          f"Unknown channel group {group!r}; expected 'input', 'output' or a "
          "tuple of axes."
      )
    return
  try:
    [int(a) for a in group]
  except (TypeError, ValueError):
    raise ValueError(
        f"A channel group is 'input', 'output' or a tuple of axes, got "
        f"{group!r}."
    ) from None


def group_axes(
    group: Group, ndim: int, layout: Optional[layouts_lib.LayoutLike] = "HWIO"
) -> tuple[int, ...]:
  """The axes one channel group of a rank-``ndim`` kernel spans.

  Args:
    group: ``"input"``, ``"output"``, or an explicit sequence of axes.
    ndim: rank of the kernel.
    layout: the kernel's layout, for a named group (ignored for explicit
      axes), e.g. ``"HWIO"``, ``"OIHW"``, ``"MHWIO"``; None means ``"HWIO"``.

  Returns:
    Non-negative axes.

  Raises:
    ValueError: for an unknown group name, a named group whose layout has
      another rank than the kernel, or an axis out of range.
  """
  check_group(group)
  if isinstance(group, str):
    layout = layouts_lib.as_layout("HWIO" if layout is None else layout)
    if layout.ndim != ndim:
      raise ValueError(
          f"Channel group {group!r} with layout {layout} needs a rank-"
          f"{layout.ndim} kernel, got a rank-{ndim} array. Pass its layout "
          "(e.g. 'MHWIO' for member-stacked kernels, 'LHWIO' for scanned "
          "layers, 'OIHW' for Equinox), or explicit axes as `group`."
      )
    return layout.group_axes(group)
  axes = tuple(int(a) for a in group)
  for a in axes:
    if not -ndim <= a < ndim:
      raise ValueError(f"Group axis {a} out of range for a rank-{ndim} array.")
  return tuple(a % ndim for a in axes)


def _sum_of_squares(w: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
  # Accumulate in at least float32 so bf16 kernels do not lose small groups.
  acc = jnp.promote_types(w.dtype, jnp.float32)
  return jnp.sum(jnp.square(w.astype(acc)), axis=axes, keepdims=keepdims)


def group_norms(
    w: ArrayLike, axes: Sequence[int], keepdims: bool = False
) -> Array:
  """ℓ2 norm of every group; a group spans ``axes``, one group per other index.

  Args:
    w: the kernel.
    axes: axes reduced inside a group, e.g. ``group_axes("input", w.ndim)``.
    keepdims: keep the reduced axes with size 1 (for broadcasting against w).

  Returns:
    The group norms, in at least float32.
  """
  w = jnp.asarray(w)
  return jnp.sqrt(_sum_of_squares(w, tuple(axes), keepdims))


def l0_threshold(lamb: ArrayLike, beta: ArrayLike) -> Array:
  """The hard-threshold level ``sqrt(2 λ / β)`` of the ℓ0 prox."""
  return jnp.sqrt(2.0 * jnp.asarray(lamb) / beta)


def hard_threshold(w: ArrayLike, gamma: ArrayLike) -> Array:
  """Hard thresholding ``H_γ(w)``: keeps entries with ``|w| > γ``, zeros others.

  An entry exactly at the threshold is zeroed (the inequality is strict), as in
  the paper's definition ``w χ{|w| > γ}``.
  """
  w = jnp.asarray(w)
  return jnp.where(jnp.abs(w) > gamma, w, jnp.zeros_like(w))


def group_l0_prox(
    w: ArrayLike,
    lamb1: ArrayLike,
    beta: ArrayLike,
    group: Group = "input",
    layout: Optional[layouts_lib.LayoutLike] = "HWIO",
) -> Array:
  """Group-ℓ0 prox: keeps a channel group iff its ℓ2 norm is ``> sqrt(2λ1/β)``.

  This is ``argmin_u λ1‖u‖_{Gℓ0} + β/2‖w − u‖²``; a group whose norm equals the
  threshold is zeroed.

  Args:
    w: a conv kernel.
    lamb1: group-ℓ0 weight λ1.
    beta: splitting weight β.
    group: channel grouping, see :func:`group_axes`.
    layout: the kernel's layout, e.g. ``"HWIO"`` (Flax), ``"OIHW"``
      (Equinox), ``"MHWIO"`` (member-stacked), ``"LHWIO"`` (scanned layers).
  """
  w = jnp.asarray(w)
  sq = _sum_of_squares(w, group_axes(group, w.ndim, layout), keepdims=True)
  # Comparing squares avoids a sqrt's rounding at exact ties.
  keep = sq > 2.0 * jnp.asarray(lamb1, sq.dtype) / beta
  return jnp.where(keep, w, jnp.zeros_like(w))


def group_lasso_grad(
    w: ArrayLike,
    lamb2: ArrayLike,
    group: Group = "input",
    layout: Optional[layouts_lib.LayoutLike] = "HWIO",
) -> Array:
  """(Sub)gradient of ``λ2 Σ_g ‖w_g‖₂``: ``λ2 w_g / sqrt(‖w_g‖² + 1e-8)``.

  The ``1e-8`` makes the subgradient of an all-zero group zero (a valid element
  of the subdifferential) and keeps it finite near zero. ``group`` and
  ``layout`` as in :func:`group_l0_prox`.
  """
  w = jnp.asarray(w)
  sq = _sum_of_squares(w, group_axes(group, w.ndim, layout), keepdims=True)
  return (lamb2 * w / jnp.sqrt(sq + GROUP_LASSO_EPS)).astype(w.dtype)


def _floor_percent_of(percent: ArrayLike, n: int) -> Array:
  """``⌊percent · n / 100⌋``, exact also for a traced ``percent``.

  Under ``jit`` XLA turns the division by the constant 100 into a product by
  its rounded reciprocal, so ``50 · 216 / 100`` gives 107.99999 and the floor
  107; the two integer comparisons below put the quotient right (they are
  exact for ``percent · n`` below 2^24 / 100).
  """
  scaled = jnp.asarray(percent, jnp.float32) * n
  q = jnp.floor(scaled / 100.0)
  q = jnp.where((q + 1.0) * 100.0 <= scaled, q + 1.0, q)
  return jnp.where(q * 100.0 > scaled, q - 1.0, q)


def _keep_largest(scores: Array, percent: ArrayLike) -> Array:
  """Boolean mask over the last axis keeping all but the ⌊p·n/100⌋ smallest.

  Ranks are unique (a stable argsort), so exactly that many entries are dropped
  per row, even with ties; among equal scores the earlier index goes first.
  """
  n = scores.shape[-1]
  n_drop = jnp.clip(_floor_percent_of(percent, n), 0, n).astype(jnp.int32)
  ranks = jnp.argsort(jnp.argsort(scores, axis=-1, stable=True), axis=-1)
  return ranks >= n_drop


def _per_layer(
    keep_fn, scores: Array, percent: ArrayLike,
    layout: Optional[layouts_lib.Layout],
) -> Array:
  """``keep_fn(rows, percent)`` over each layer: every index of the layout's
  stacked axes (``None``: the whole array is one layer).

  ``keep_fn`` sees the scores as ``(*stack, n)``, one row per layer, the
  ``n`` entries in C order of the remaining axes (for channel norms kept with
  ``keepdims``: the channel index), and returns a boolean mask shaped alike.
  """
  if layout is None:
    return keep_fn(scores.reshape(-1), percent).reshape(scores.shape)
  moved = layout.layers_first(scores)
  stack = moved.shape[: len(layout.stack_axes)]
  keep = keep_fn(moved.reshape(*stack, -1), percent)
  return layout.layers_back(keep.reshape(moved.shape))


def _authors_keep_elements(w: Array, percent: ArrayLike) -> Array:
  """The authors' element rule over the last axis: signed percentile.

  The threshold is ``np.percentile`` (linear interpolation) of the *signed*
  weights, and entries with ``|w|`` below it are zeroed. For weights symmetric
  about 0 the ``p``-th signed percentile is the ``(2p − 100)``-th percentile of
  the magnitudes, so "80 %" zeroes about 60 % (and "50 %" or less, none).
  """
  x = w.astype(jnp.promote_types(w.dtype, jnp.float32))
  thr = jnp.percentile(x, jnp.asarray(percent, x.dtype), axis=-1,
                       keepdims=True)
  return jnp.abs(x) >= thr


def _numpy_percentile(a: Array, q: Array) -> Array:
  """``np.percentile(a, q, axis=-1)`` (linear) as NumPy computes it for a
  float32 ``a`` and a Python-float ``q``: the same virtual index and the same
  two-sided interpolation, so a value on the threshold lands on the same side.
  """
  n = a.shape[-1]
  sorted_a = jnp.sort(a, axis=-1)
  quantile = q / 100
  virtual = n * quantile + (1 - quantile) - 1
  below = jnp.clip(jnp.floor(virtual), 0, n - 1)
  above = jnp.clip(below + 1, 0, n - 1)
  gamma = (virtual - below).astype(a.dtype)
  low = sorted_a[..., below.astype(jnp.int32)]
  high = sorted_a[..., above.astype(jnp.int32)]
  diff = high - low
  return jnp.where(gamma >= 0.5, high - diff * (1 - gamma), low + diff * gamma)


def _authors_keep_channels(norms: Array, percent: ArrayLike) -> Array:
  """The authors' channel rule over the last axis: a running percentile.

  One pass over the channels in index order, over an array ``a`` that starts
  as the channel norms. At channel ``i`` the threshold is
  ``np.percentile(a, percent)`` (linear interpolation) of the *whole* array;
  channel ``i`` is kept iff its norm is above it, and ``a[i]`` is overwritten
  with the decision: 1.0 if kept, 0.0 if pruned. The threshold is thus taken
  among the decisions (0 or 1) of the channels visited and the norms of the
  others, so it depends on the norms' scale: with norms well above 1 (as at
  He initialisation) the visited entries drag the threshold down and the
  later channels are kept. Sequential by nature: a ``lax.scan`` over the
  channels.
  """
  norms = norms.astype(jnp.promote_types(norms.dtype, jnp.float32))
  n = norms.shape[-1]
  q = jnp.asarray(percent, norms.dtype)
  index = jnp.arange(n)

  def visit(a, i):
    keep = norms[..., i] > _numpy_percentile(a, q)
    a = jnp.where(index == i, keep[..., None].astype(a.dtype), a)
    return a, keep

  _, keep = jax.lax.scan(visit, norms, index)
  return jnp.moveaxis(keep, 0, -1)


STRUCTURES = ("element", "channel")

# "exact": fkjax's projection, exactly the given share; "authors": the rules of
# the authors' released code (BaoWangMath/rvsm-rgsm-admm), see
# :func:`admm_projection`.
ADMM_VARIANTS = ("exact", "authors")


def check_structure(structure: str) -> None:
  if structure not in STRUCTURES:
    raise ValueError(
        f"Unknown ADMM structure {structure!r}; expected 'element' or "
        "'channel'."
    )


def check_variant(variant: str) -> None:
  if variant not in ADMM_VARIANTS:
    raise ValueError(
        f"Unknown ADMM variant {variant!r}; expected 'exact' (fkjax's "
        "projection: exactly the given share) or 'authors' (the rules of the "
        "authors' released code)."
    )


def admm_projection(
    w: ArrayLike,
    percent: ArrayLike,
    structure: str = "element",
    group: Group = "input",
    layout: Optional[layouts_lib.LayoutLike] = None,
    variant: str = "exact",
) -> Array:
  """ADMM's projection: zero the ``percent`` % smallest entries (or channels).

  The projection is per layer: per member, scanned layer, ... for stacked
  kernels (the ``M``, ``L``, ``S`` axes of the layout, e.g. ``"MHWIO"``).

  ``variant="exact"`` (the default): each layer keeps its own largest
  ``(100 − percent)`` % magnitudes (``structure="element"``) or channel-group
  norms (``structure="channel"``); exactly ``⌊percent · n / 100⌋`` of the
  ``n`` entries (or groups) of each layer are zeroed.

  ``variant="authors"``: the rules of the authors' released code, which zero
  fewer (see ``docs/protocol.md``):

  * element: entries with ``|w|`` below ``np.percentile`` of the *signed*
    weights are zeroed (about 60 % at "80 %" for weights symmetric about 0);
  * channel: the channels are visited in index order over an array that
    starts as the channel norms (``sqrt(‖w_g‖² + 1e-8)``); at channel ``i``
    the threshold is the percentile of the whole array as it is, channel
    ``i`` is pruned iff its norm is at most the threshold, and its entry is
    overwritten with the decision, 1.0 kept or 0.0 pruned (about 48 % pruned
    at "80 %" on He-initialised ResNet20 kernels).

  Percentiles interpolate linearly, as NumPy's default.

  Args:
    w: the kernel.
    percent: percentage to prune, in [0, 100]; may be traced.
    structure: ``"element"`` or ``"channel"``.
    group: channel grouping for ``structure="channel"``, see :func:`group_axes`.
    layout: the kernel's layout. ``None``: the whole array is one layer, and
      named channel groups take it as ``"HWIO"``.
    variant: ``"exact"`` or ``"authors"``.
  """
  w = jnp.asarray(w)
  check_structure(structure)
  check_variant(variant)
  if layout is not None:
    layout = layouts_lib.as_layout(layout)
    if layout.ndim != w.ndim:
      raise ValueError(
          f"Layout {layout} needs a rank-{layout.ndim} kernel, got a rank-"
          f"{w.ndim} array."
      )
  exact = variant == "exact"
  if structure == "element":
    keep_fn = _keep_largest if exact else _authors_keep_elements
    keep = _per_layer(keep_fn, jnp.abs(w) if exact else w, percent, layout)
  else:
    sq = _sum_of_squares(w, group_axes(group, w.ndim, layout), keepdims=True)
    # The group index runs over the kept (non-reduced) axes; stacked axes stay
    # separate layers.
    if exact:
      keep = _per_layer(_keep_largest, sq, percent, layout)
    else:
      # Norms, not squares (the percentile interpolates between them), with
      # the authors' 1e-8 under the root.
      keep = _per_layer(_authors_keep_channels,
                        jnp.sqrt(sq + GROUP_LASSO_EPS), percent, layout)
  return jnp.where(keep, w, jnp.zeros_like(w))
