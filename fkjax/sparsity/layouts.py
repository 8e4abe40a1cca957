"""Where a kernel's channel axes are: explicit layouts, never guessed from rank.

A layout is a string with one letter per axis, each letter at most once:

* ``D``, ``H``, ``W``: spatial axes (depth, height, width). A channel group
  spans them;
* ``I`` and ``O``: the input- and output-channel axes (exactly one each);
* ``M``, ``L``, ``S``: axes that stack separate copies of the layer, which
  stay apart: ``M`` the members of an ensemble or vmapped models
  (``nn.vmap``, ``eqx.filter_vmap``), ``L`` scanned layers (``nn.scan``,
  ``nnx.scan``: kernels ``(L, 3, 3, I, O)``), ``S`` any other stack (e.g.
  the runs of a sweep). The three behave alike: every index of a stacked axis
  is a layer of its own, with its own channel groups; ADMM prunes each one on
  its own, and the reports count each one's channels. A kernel may have
  several (``"MLHWIO"``: an ensemble of scanned stacks).

Any other letter is refused: a layout says what every axis is, so an axis is
never pooled into the channel groups by a letter that was meant otherwise.

Flax (linen and NNX) convolution kernels are ``"HWIO"``; Equinox's
``Conv2d.weight`` and PyTorch's are ``"OIHW"``; a 3-D convolution in Flax is
``"DHWIO"``; a 2-D convolution kernel whose axis 0 stacks ensemble members is
``"MHWIO"``, one whose axis 0 stacks scanned layers ``"LHWIO"``.

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

# What each letter of a layout is; see the module docstring.
SPATIAL_AXES = "DHW"
INPUT_AXIS = "I"
OUTPUT_AXIS = "O"
STACKED_AXES = "MLS"
AXIS_LETTERS = SPATIAL_AXES + INPUT_AXIS + OUTPUT_AXIS + STACKED_AXES

_LETTERS_HELP = (
    "D, H, W spatial; I input channels; O output channels; M, L, S stacked "
    "copies kept apart (M ensemble members or vmapped models, L scanned "
    "layers, S any other stack)"
)

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
    if not isinstance(axes, str) or not axes:
      raise ValueError(
          f"A layout is a string with one letter per axis such as 'HWIO' "
          f"({_LETTERS_HELP}), got {axes!r}."
      )
    unknown = sorted({a for a in axes if a not in AXIS_LETTERS})
    if unknown:
      raise ValueError(
          f"Layout {axes!r}: unknown axis letter(s) {', '.join(unknown)}; a "
          f"layout's letters are {_LETTERS_HELP}."
      )
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
      raise ValueError(
          f"Layout {axes!r} repeats {', '.join(repeated)}: each letter names "
          f"one axis ({_LETTERS_HELP})."
      )
    if INPUT_AXIS not in axes or OUTPUT_AXIS not in axes:
      raise ValueError(
          f"Layout {axes!r} must name one input-channel axis 'I' and one "
          "output-channel axis 'O'."
      )

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
  def stack_axes(self) -> tuple[int, ...]:
    """The stacked axes (``M``, ``L``, ``S``): separate layers, never pooled."""
    return tuple(i for i, a in enumerate(self.axes) if a in STACKED_AXES)

  @property
  def spatial_axes(self) -> tuple[int, ...]:
    """The spatial axes (``D``, ``H``, ``W``)."""
    return tuple(i for i, a in enumerate(self.axes) if a in SPATIAL_AXES)

  @property
  def layer(self) -> "Layout":
    """The layout of one layer of the stack: the stacked letters left out."""
    return Layout("".join(a for a in self.axes if a not in STACKED_AXES))

  def _layers_first_order(self) -> tuple[int, ...]:
    stack = self.stack_axes
    return stack + tuple(i for i in range(self.ndim) if i not in stack)

  def layers_first(self, x: Any) -> Any:
    """``x`` (a kernel of this layout, or one reduced with ``keepdims``) with
    its stacked axes moved to the front, in order: ``x[m, l]`` is then one
    layer. Works on NumPy and JAX arrays alike."""
    return x.transpose(self._layers_first_order())

  def layers_back(self, x: Any) -> Any:
    """The inverse of :meth:`layers_first`."""
    order = self._layers_first_order()
    return x.transpose(tuple(order.index(i) for i in range(self.ndim)))

  def group_axes(self, group: str) -> tuple[int, ...]:
    """The axes one channel group spans.

    Args:
      group: ``"input"`` (a group is one input channel: every axis but ``I``
        and the stacked axes) or ``"output"`` (one filter: every axis but
        ``O`` and the stacked axes).
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
        i for i in range(self.ndim) if i != keep and i not in self.stack_axes
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
          "axis 0 stacks ensemble members, 'LHWIO' for scanned layers), or "
          "explicit axes as `group`."
      )
    return fn(x, found, *xs)

  if keep is None:
    keep = jax.tree.map(lambda _: True, tree)
  return jax.tree_util.tree_map_with_path(leaf_fn, tree, keep, *rest)
