"""Which parameters are sparsified.

By default every convolution kernel is, and nothing else: BatchNorm ``scale``
and ``bias``, biases and the final dense layer stay dense, as in the paper.
"""
from __future__ import annotations

from typing import Any, Callable, Union

import jax
import optax

PyTree = Any

# The default of every ``mask`` argument: select :func:`conv_kernel_mask`.
# A string rather than the function itself because ``optax.inject_hyperparams``
# treats every callable argument, defaults included, as a schedule; a callable
# default would silently be replaced by ``conv_kernel_mask(step)``.
CONV_KERNELS = "conv_kernels"

# ``mask`` arguments accept: a pytree of bools (same structure as the params, or
# a prefix of it), a callable params -> such a pytree (like ``optax.masked``),
# CONV_KERNELS, or None (every leaf).
Mask = Union[PyTree, Callable[[PyTree], PyTree], str, None]


def _key_name(entry: Any) -> Any:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return entry


def path_name(path: tuple[Any, ...]) -> str:
  """``('Conv_0', 'kernel')``-style key path -> ``"Conv_0/kernel"``."""
  return "/".join(str(_key_name(e)) for e in path)


def conv_kernel_mask(params: PyTree) -> PyTree:
  """True for convolution kernels, False for every other leaf.

  A leaf is a conv kernel when its last key is ``kernel`` and it has at least 4
  dimensions: a Flax ``HWIO`` kernel, or ``(members, H, W, I, O)`` for an
  ``nn.vmap`` ensemble. Dense kernels (2-D, or 3-D with a member axis) and
  BatchNorm ``scale``/``bias`` get False.

  Works on params and on updates (``optax.masked`` calls it on the updates).
  """

  def is_conv_kernel(path, leaf) -> bool:
    return bool(
        path
        and _key_name(path[-1]) == "kernel"
        and getattr(leaf, "ndim", 0) >= 4
    )

  return jax.tree_util.tree_map_with_path(is_conv_kernel, params)


def mask_fn(mask: Mask) -> Union[PyTree, Callable[[PyTree], PyTree], None]:
  """The mask in the form ``optax.masked`` takes (None means no masking)."""
  if isinstance(mask, str):
    if mask != CONV_KERNELS:
      raise ValueError(
          f"Unknown mask {mask!r}; pass {CONV_KERNELS!r}, a pytree of bools, a "
          "callable, or None."
      )
    return conv_kernel_mask
  return mask


def resolve_mask(mask: Mask, params: PyTree) -> PyTree:
  """A bool per leaf of ``params``, from any form a ``mask`` argument takes."""
  mask = mask_fn(mask)
  if mask is None:
    return jax.tree.map(lambda _: True, params)
  tree = mask(params) if callable(mask) else mask
  # A prefix mask covers whole subtrees: broadcast each bool down to its leaves.
  return jax.tree.map(
      lambda m, sub: jax.tree.map(lambda _: bool(m), sub), tree, params
  )


def maybe_masked(
    inner: optax.GradientTransformation, mask: Mask
) -> optax.GradientTransformation:
  """Wraps ``inner`` in ``optax.masked`` unless the mask selects every leaf."""
  mask = mask_fn(mask)
  if mask is None:
    return inner
  return optax.masked(inner, mask)
