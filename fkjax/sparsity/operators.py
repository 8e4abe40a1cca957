"""Proximal and projection operators behind RVSM, RGSM and ADMM.

Every function here acts on one array, is pure and jittable, and accepts traced
hyperparameters (so the transformations built on top of them work with
``optax.inject_hyperparams``).

Channel groups follow Flax's ``HWIO`` convolution layout. Axes are counted from
the end, so any leading axes (the member axis of an ``nn.vmap`` ensemble, whose
kernels are ``(members, H, W, I, O)``) index separate groups: members are never
folded together.
"""
from __future__ import annotations

from typing import Sequence, Union

import jax
import jax.numpy as jnp

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

# A channel grouping: "input" (one group per input channel, the default of the
# authors' code), "output" (one group per filter), or explicit axes to reduce.
Group = Union[str, Sequence[int]]

_NAMED_GROUPS = {
    # HWIO: an input-channel group spans H, W and all filters.
    "input": (-4, -3, -1),
    # HWIO: a filter spans H, W and all input channels.
    "output": (-4, -3, -2),
}

# Numerical floor inside the group-lasso subgradient, as in the paper's code;
# it makes the subgradient of an all-zero group exactly zero.
GROUP_LASSO_EPS = 1e-8


def group_axes(group: Group, ndim: int) -> tuple[int, ...]:
  """The (negative) axes one channel group of a rank-``ndim`` kernel spans.

  Args:
    group: ``"input"``, ``"output"``, or an explicit sequence of axes.
    ndim: rank of the kernel.

  Raises:
    ValueError: for an unknown group name, or a named group on a kernel with
      fewer than 4 dimensions (the names assume a 2-D convolution, HWIO).
  """
  if isinstance(group, str):
    if group not in _NAMED_GROUPS:
      raise ValueError(
          f"Unknown channel group {group!r}; expected 'input', 'output' or a "
          "tuple of axes."
      )
    if ndim < 4:
      raise ValueError(
          f"Channel group {group!r} needs a conv kernel (H, W, I, O) with "
          f"optional leading axes, got a rank-{ndim} array. Pass explicit axes "
          "as `group` for other layouts."
      )
    return _NAMED_GROUPS[group]
  axes = tuple(int(a) for a in group)
  for a in axes:
    if not -ndim <= a < ndim:
      raise ValueError(f"Group axis {a} out of range for a rank-{ndim} array.")
  return axes


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
    w: ArrayLike, lamb1: ArrayLike, beta: ArrayLike, group: Group = "input"
) -> Array:
  """Group-ℓ0 prox: keeps a channel group iff its ℓ2 norm is ``> sqrt(2λ1/β)``.

  This is ``argmin_u λ1‖u‖_{Gℓ0} + β/2‖w − u‖²``; a group whose norm equals the
  threshold is zeroed.

  Args:
    w: a conv kernel, ``(..., H, W, I, O)``.
    lamb1: group-ℓ0 weight λ1.
    beta: splitting weight β.
    group: channel grouping, see :func:`group_axes`.
  """
  w = jnp.asarray(w)
  sq = _sum_of_squares(w, group_axes(group, w.ndim), keepdims=True)
  # Comparing squares avoids a sqrt's rounding at exact ties.
  keep = sq > 2.0 * jnp.asarray(lamb1, sq.dtype) / beta
  return jnp.where(keep, w, jnp.zeros_like(w))


def group_lasso_grad(
    w: ArrayLike, lamb2: ArrayLike, group: Group = "input"
) -> Array:
  """(Sub)gradient of ``λ2 Σ_g ‖w_g‖₂``: ``λ2 w_g / sqrt(‖w_g‖² + 1e-8)``.

  The ``1e-8`` makes the subgradient of an all-zero group zero (a valid element
  of the subdifferential) and keeps it finite near zero.
  """
  w = jnp.asarray(w)
  sq = _sum_of_squares(w, group_axes(group, w.ndim), keepdims=True)
  return (lamb2 * w / jnp.sqrt(sq + GROUP_LASSO_EPS)).astype(w.dtype)


def _keep_largest(scores: Array, percent: ArrayLike) -> Array:
  """Boolean mask over the last axis keeping all but the ⌊p·n/100⌋ smallest.

  Ranks are unique (a stable argsort), so exactly that many entries are dropped
  per row, even with ties; among equal scores the earlier index goes first.
  """
  n = scores.shape[-1]
  n_drop = jnp.floor(jnp.asarray(percent, jnp.float32) * n / 100.0)
  n_drop = jnp.clip(n_drop, 0, n).astype(jnp.int32)
  ranks = jnp.argsort(jnp.argsort(scores, axis=-1, stable=True), axis=-1)
  return ranks >= n_drop


def _num_layer_axes(ndim: int) -> int:
  # A conv kernel is its last 4 axes; anything before (ensemble members) indexes
  # separate layers. Smaller arrays are one layer each.
  return min(ndim, 4)


def admm_projection(
    w: ArrayLike,
    percent: ArrayLike,
    structure: str = "element",
    group: Group = "input",
) -> Array:
  """ADMM's projection: zero the ``percent`` % smallest entries (or channels).

  The projection is per layer, and per member for member-stacked kernels
  ``(members, H, W, I, O)``: each member keeps its own largest
  ``(100 − percent)`` % magnitudes (``structure="element"``) or channel-group
  norms (``structure="channel"``). Exactly ``⌊percent · n / 100⌋`` of the ``n``
  entries (or groups) of each layer are zeroed.

  Args:
    w: the kernel.
    percent: percentage to prune, in [0, 100]; may be traced.
    structure: ``"element"`` or ``"channel"``.
    group: channel grouping for ``structure="channel"``, see :func:`group_axes`.
  """
  w = jnp.asarray(w)
  if structure == "element":
    lead = w.shape[: w.ndim - _num_layer_axes(w.ndim)]
    scores = jnp.abs(w).reshape(*lead, -1)
    keep = _keep_largest(scores, percent).reshape(w.shape)
  elif structure == "channel":
    axes = group_axes(group, w.ndim)
    sq = _sum_of_squares(w, axes, keepdims=True)
    # The group index runs over the kept (non-reduced) axes of the last 4; the
    # leading axes stay separate layers.
    lead = sq.shape[: w.ndim - _num_layer_axes(w.ndim)]
    keep = _keep_largest(sq.reshape(*lead, -1), percent).reshape(sq.shape)
  else:
    raise ValueError(
        f"Unknown ADMM structure {structure!r}; expected 'element' or "
        "'channel'."
    )
  return jnp.where(keep, w, jnp.zeros_like(w))
