"""Which parameters are sparsified.

By default every 2-D convolution kernel is, and nothing else: BatchNorm
``scale`` and ``bias``, biases and the final dense layer stay dense, as in the
paper. A convolution kernel is a leaf that :mod:`fkjax.sparsity.layouts`
gives a layout: by default a rank-4 ``kernel`` (Flax linen / NNX, ``HWIO``) or
a rank-4 ``weight`` (Equinox, ``OIHW``).

A selection that selects nothing is an error, in every public function:
a sparsifier that silently does nothing would report 0 % sparsity.
"""
from __future__ import annotations

from typing import Any, Callable, Union

import jax
import optax

from fkjax.sparsity import layouts as layouts_lib

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

# Kept as a name of this module: the metrics and plots import it from here.
path_name = layouts_lib.path_name


def _ambiguous_kernel_error(path, leaf) -> ValueError:
  name = layouts_lib.leaf_name(path)
  return ValueError(
      f"fkjax.sparsity: {path_name(path)!r} has shape {tuple(leaf.shape)}: "
      f"a rank-{leaf.ndim} {name!r} could be a 3-D convolution or a stack of "
      "2-D ones, and fkjax.sparsity does not guess. Say where its axes are "
      "with `layout=`, e.g. layout='MHWIO' when axis 0 stacks ensemble members "
      "(fkjax's EnResNet, nn.vmap), 'LHWIO' when it stacks scanned layers "
      "(nn.scan), 'DHWIO' for a 3-D convolution, "
      "('HWIO', 'MHWIO') for a tree holding both plain and stacked kernels; "
      "or leave it out with `mask=`."
  )


def conv_kernel_mask(
    params: PyTree, layout: layouts_lib.LayoutSpec = None
) -> PyTree:
  """True for convolution kernels, False for every other leaf.

  A leaf is a convolution kernel when ``layout`` gives it a layout (see
  :mod:`fkjax.sparsity.layouts`): with the default, a rank-4 ``kernel``
  (Flax ``HWIO``) or a rank-4 ``weight`` (Equinox ``OIHW``). Dense kernels,
  biases and BatchNorm ``scale``/``bias`` get False.

  Works on params and on updates (``optax.masked`` calls it on the updates).

  Raises:
    ValueError: under the default layouts, for a ``kernel`` or ``weight`` of
      rank 5 or more (a 3-D convolution, or stacked 2-D ones?): say which
      with ``layout=``.
  """
  spec = layouts_lib.normalize(layout)

  def is_conv_kernel(path, leaf) -> bool:
    if spec.is_ambiguous(path, leaf):
      raise _ambiguous_kernel_error(path, leaf)
    return spec.for_leaf(path, leaf) is not None

  return jax.tree_util.tree_map_with_path(is_conv_kernel, params)


def mask_fn(
    mask: Mask, layout: layouts_lib.LayoutSpec = None
) -> Union[PyTree, Callable[[PyTree], PyTree], None]:
  """The mask in the form ``optax.masked`` takes (None means no masking)."""
  if isinstance(mask, str):
    if mask != CONV_KERNELS:
      raise ValueError(
          f"Unknown mask {mask!r}; pass {CONV_KERNELS!r}, a pytree of bools, a "
          "callable, or None."
      )
    spec = layouts_lib.normalize(layout)
    return lambda params: conv_kernel_mask(params, spec)
  return mask


def resolve_mask(
    mask: Mask, params: PyTree, layout: layouts_lib.LayoutSpec = None
) -> PyTree:
  """A bool per leaf of ``params``, from any form a ``mask`` argument takes."""
  mask = mask_fn(mask, layout)
  if mask is None:
    return jax.tree.map(lambda _: True, params)
  tree = mask(params) if callable(mask) else mask
  # A prefix mask covers whole subtrees: broadcast each bool down to its leaves.
  return jax.tree.map(
      lambda m, sub: jax.tree.map(lambda _: bool(m), sub), tree, params
  )


def _describe_mask(mask: Mask, spec: layouts_lib.Layouts) -> str:
  if isinstance(mask, str):
    return "convolution kernels: leaves named " + spec.describe()
  if mask is None:
    return "every leaf (mask=None)"
  if callable(mask):
    name = getattr(mask, "__name__", mask)
    return f"the leaves the mask function {name!r} marks True"
  return "the leaves the mask pytree marks True"


def nothing_selected_error(
    who: str, mask: Mask, params: PyTree, layout: layouts_lib.LayoutSpec
) -> ValueError:
  """The error of a selection that selects no leaf of ``params``."""
  spec = layouts_lib.normalize(layout)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  msg = (f"fkjax.sparsity.{who}: nothing to sparsify: looked for "
         f"{_describe_mask(mask, spec)}, found none among the {len(leaves)} "
         "leaves of the parameter tree.")
  if isinstance(mask, str):
    names = set(spec.names())
    near = [f"{path_name(p)!r} {tuple(x.shape)}" for p, x in leaves
            if layouts_lib.leaf_name(p) in names and hasattr(x, "shape")]
    if near:
      msg += (" Leaves with those names but another rank: "
              + ", ".join(near[:4]) + (", ..." if len(near) > 4 else "")
              + "; pass `layout=` with their layout (e.g. 'MHWIO' for "
              "kernels whose axis 0 stacks ensemble members, 'LHWIO' for "
              "scanned layers).")
    else:
      msg += (" For kernels with other names pass `layout={name: layout}`, "
              "or select leaves with `mask=`.")
  return ValueError(msg)


def select(
    who: str, mask: Mask, params: PyTree, layout: layouts_lib.LayoutSpec = None
) -> PyTree:
  """:func:`resolve_mask`, raising when it selects no leaf of ``params``."""
  keep = resolve_mask(mask, params, layout)
  if not any(jax.tree.leaves(keep)):
    raise nothing_selected_error(who, mask, params, layout)
  return keep


def maybe_masked(
    inner: optax.GradientTransformation,
    mask: Mask,
    layout: layouts_lib.LayoutSpec = None,
    who: str = "transformation",
) -> optax.GradientTransformation:
  """``optax.masked(inner, mask)`` whose ``init`` raises if nothing is selected.

  No masking when the mask is None (every leaf).
  """
  fn = mask_fn(mask, layout)
  tx = inner if fn is None else optax.masked(inner, fn)

  def init_fn(params):
    # Shapes and paths only: this check costs nothing under jit.
    select(who, mask, params, layout)
    return tx.init(params)

  return optax.GradientTransformation(init_fn, tx.update)
