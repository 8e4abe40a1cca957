"""Where a kernel's channel axes are: explicit layouts, never guessed from rank.

A layout is a string with one letter per axis:

* ``I`` and ``O``: the input- and output-channel axes (exactly one each);
* ``M``: an axis that stacks independent copies of the layer, e.g. the members
  of an ensemble built with ``nn.vmap`` / ``nn.scan`` / ``eqx.filter_vmap``.
  Copies are never pooled: each one has its own channel groups, and ADMM
  prunes each one on its own;
* any other capital letter (``D``, ``H``, ``W``, ...): a spatial axis.

Flax (linen and NNX) convolution kernels are ``"HWIO"``; Equinox's
``Conv2d.weight`` and PyTorch's are ``"OIHW"``; a 3-D convolution in Flax is
``"DHWIO"``; a 2-D convolution kernel whose axis 0 stacks ensemble members is
``"MHWIO"``.

Every ``layout`` argument of :mod:`fkjax.sparsity` takes one of:

* ``None`` (the default): :data:`DEFAULT_LAYOUTS`, i.e. leaves named
  ``kernel`` are ``HWIO`` (linen, NNX) and leaves named ``weight`` are
  ``OIHW`` (Equinox). A rank-5 or larger ``kernel``/``weight`` is then an
  error: it could be a 3-D convolution or a stack of 2-D ones, so say which;
* a layout string (or :class:`Layout`), or a sequence of them with distinct
  ranks: leaves named ``kernel`` or ``weight`` whose rank is a layout's rank
  get that layout, e.g. ``("HWIO", "MHWIO")`` for a tree that holds both
  plain and member-stacked kernels;
* a mapping ``{leaf name: layout or sequence of layouts}``, for other names.

The leaf name is the last key of the leaf's path (``Conv_0/kernel`` ->
``kernel``); a Flax NNX ``nnx.state`` path's trailing ``.value`` is skipped.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax

PyTree = Any

# The names a layout given without names (a string or a sequence) applies to:
# Flax's and Equinox's convolution kernels.
KERNEL_NAMES = ("kernel", "weight")

# Trailing path entries that name no layer: nnx.state(model) leaves end in the
# Variable's `.value`.
_VARIABLE_ATTRS = ("value", "raw_value")


@dataclasses.dataclass(frozen=True)
class Layout:
  """The axes of a kernel, e.g. ``Layout("HWIO")``; see the module docstring.

  Attributes:
    axes: one letter per axis, e.g. ``"HWIO"``, ``"OIHW"``, ``"MHWIO"``.
  """

  axes: str

  def __post_init__(self):
    axes = self.axes
    if not isinstance(axes, str) or not axes.isalpha() or not axes.isupper():
      raise ValueError(
          f"A layout is a string of capital letters such as 'HWIO', got "
          f"{axes!r}."
      )
    if axes.count("I") != 1 or axes.count("O") != 1:
      raise ValueError(
          f"Layout {axes!r} must name exactly one input-channel axis 'I' and "
          "one output-channel axis 'O'."
      )
    spatial = [a for a in axes if a not in "IOM"]
    if len(set(spatial)) != len(spatial):
      raise ValueError(f"Layout {axes!r} repeats a spatial axis.")

  @property
  def ndim(self) -> int:
    """The rank of the kernels this layout describes."""
    return len(self.axes)

  @property
  def in_axis(self) -> int:
    return self.axes.index("I")

  @property
  def out_axis(self) -> int:
    return self.axes.index("O")

  @property
  def member_axes(self) -> tuple[int, ...]:
    """Axes that stack independent copies (``M``)."""
    return tuple(i for i, a in enumerate(self.axes) if a == "M")

  def group_axes(self, group: str) -> tuple[int, ...]:
    """The axes one channel group spans.

    Args:
      group: ``"input"`` (a group is one input channel: every axis but ``I``
        and the member axes) or ``"output"`` (one filter: every axis but
        ``O`` and the member axes).
    """
    if group == "input":
      keep = self.in_axis
    elif group == "output":
      keep = self.out_axis
    else:
      raise ValueError(
          f"Unknown channel group {group!r}; expected 'input', 'output' or a "
          "tuple of axes."
      )
    return tuple(
        i for i in range(self.ndim) if i != keep and i not in self.member_axes
    )

  def __str__(self) -> str:
    return self.axes


LayoutLike = Union[str, Layout]
# What a `layout` argument takes; see the module docstring.
LayoutSpec = Union[
    None,
    LayoutLike,
    Sequence[LayoutLike],
    Mapping[str, Union[LayoutLike, Sequence[LayoutLike]]],
]

# leaf name -> layouts, when `layout=None`.
DEFAULT_LAYOUTS: Mapping[str, tuple[str, ...]] = {
    "kernel": ("HWIO",),  # Flax linen and NNX convolutions
    "weight": ("OIHW",),  # Equinox (and PyTorch) convolutions
}


def as_layout(layout: LayoutLike) -> Layout:
  return layout if isinstance(layout, Layout) else Layout(layout)


def _layout_tuple(value: Any) -> tuple[Layout, ...]:
  values = (value,) if isinstance(value, (str, Layout)) else tuple(value)
  layouts = tuple(as_layout(v) for v in values)
  ranks = [l.ndim for l in layouts]
  if len(set(ranks)) != len(ranks):
    raise ValueError(
        "Layouts given together must have distinct ranks (a leaf's rank picks "
        f"its layout), got {[str(l) for l in layouts]}."
    )
  return layouts


@dataclasses.dataclass(frozen=True)
class Layouts:
  """A normalised, hashable ``layout`` argument: leaf name -> layouts.

  Build it with :func:`normalize`; it is what the transformations keep in their
  (static) state.
  """

  by_name: tuple[tuple[str, tuple[Layout, ...]], ...]
  is_default: bool = False

  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.by_name)

  def for_leaf(self, path: tuple[Any, ...], leaf: Any) -> Optional[Layout]:
    """The layout of the leaf at ``path``, or None when none applies."""
    name = leaf_name(path)
    ndim = getattr(leaf, "ndim", None)
    for n, layouts in self.by_name:
      if n == name:
        for layout in layouts:
          if layout.ndim == ndim:
            return layout
    return None

  def is_ambiguous(self, path: tuple[Any, ...], leaf: Any) -> bool:
    """A rank >= 5 kernel under the default layouts: stacked or 3-D?"""
    return (self.is_default and leaf_name(path) in self.names()
            and getattr(leaf, "ndim", 0) >= 5)

  def describe(self) -> str:
    """E.g. ``'kernel' as HWIO, 'weight' as OIHW``."""
    return ", ".join(
        f"{name!r} as " + " or ".join(str(l) for l in layouts)
        for name, layouts in self.by_name
    )


def normalize(layout: LayoutSpec) -> Layouts:
  """Normalises any ``layout`` argument (see the module docstring)."""
  if isinstance(layout, Layouts):
    return layout
  if layout is None:
    return Layouts(
        tuple((k, _layout_tuple(v)) for k, v in DEFAULT_LAYOUTS.items()),
        is_default=True,
    )
  if isinstance(layout, Mapping):
    return Layouts(tuple((str(k), _layout_tuple(v)) for k, v in layout.items()))
  found = _layout_tuple(layout)
  return Layouts(tuple((name, found) for name in KERNEL_NAMES))


def _key_name(entry: Any) -> Any:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return entry


def _strip_variable_attr(path: tuple[Any, ...]) -> tuple[Any, ...]:
  # Only attribute entries (GetAttrKey): a dict key named "value" is a name.
  while (path and hasattr(path[-1], "name")
         and path[-1].name in _VARIABLE_ATTRS):
    path = path[:-1]
  return path


def leaf_name(path: tuple[Any, ...]) -> Any:
  """The last key of ``path`` (an NNX ``.value`` skipped), e.g. ``kernel``."""
  path = _strip_variable_attr(tuple(path))
  return _key_name(path[-1]) if path else None


def path_key(path: tuple[Any, ...]) -> tuple[Any, ...]:
  """The names along ``path``, Variable attributes (NNX ``.value``) left out.

  Two trees of the same layers give the same keys even when their nodes are
  different Variable types (``nnx.Param`` in the params, ``OptVariable`` in
  ``nnx.Optimizer``'s state).
  """
  return tuple(
      _key_name(e) for e in path
      if not (hasattr(e, "name") and e.name in _VARIABLE_ATTRS)
  )


def path_name(path: tuple[Any, ...]) -> str:
  """``('Conv_0', 'kernel')``-style key path -> ``"Conv_0/kernel"``.

  An NNX path's trailing ``.value`` is left out, so linen, NNX and plain-dict
  trees of the same layers give the same names.
  """
  return "/".join(
      str(_key_name(e)) for e in _strip_variable_attr(tuple(path))
  )


def tree_map_with_layouts(
    who: str,
    fn: Callable[..., Any],
    layout: LayoutSpec,
    tree: PyTree,
    *rest: PyTree,
    need_layout: bool = True,
    keep: Optional[PyTree] = None,
) -> PyTree:
  """``fn(leaf, layout_or_None, *rest_leaves)`` over ``tree``'s leaves.

  Args:
    who: the public function, for error messages.
    fn: the per-leaf function.
    layout: any ``layout`` argument.
    tree: the tree whose paths and shapes pick the layouts (masked-out
      ``optax.MaskedNode`` entries have no leaves and are skipped).
    *rest: trees with the same structure, passed leaf by leaf.
    need_layout: raise for a leaf without a layout (named channel groups
      need one); otherwise ``fn`` gets None for it.
    keep: optional bools shaped like ``tree``: leaves marked False are
      returned unchanged, without ``fn`` (and need no layout).
  """
  spec = normalize(layout)

  def leaf_fn(path, x, k, *xs):
    if not k:
      return x
    found = spec.for_leaf(path, x)
    if found is None and need_layout:
      raise ValueError(
          f"fkjax.sparsity.{who}: {path_name(path)!r} has shape "
          f"{tuple(getattr(x, 'shape', ()))}, which no layout describes "
          f"(layouts: {spec.describe()}), so its channel axes are unknown. "
          "Pass its layout with `layout=` (e.g. 'MHWIO' for kernels whose "
          "axis 0 stacks ensemble members), or explicit axes as `group`."
      )
    return fn(x, found, *xs)

  if keep is None:
    keep = jax.tree.map(lambda _: True, tree)
  return jax.tree_util.tree_map_with_path(leaf_fn, tree, keep, *rest)
