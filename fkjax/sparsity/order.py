"""Whether a chain built from the pieces puts them where they work.

The wrappers (``sparsity.rvsm(optimizer, ...)``) cannot be put together
wrong; a chain of the pieces can, and runs without a word while working
against sparsity. An ``optax.chain`` state is a tuple in the chain's order, so
the places can be read from it: each piece's state says which piece it is
(and a splitting step's :class:`~fkjax.sparsity.transforms.Placement` which
form), and the optimiser's states say where momentum (``optax.trace``, Adam,
...) and a scheduled learning-rate scaling (``ScaleByScheduleState``) are.
A constant learning rate's scaling leaves no state, so where it is cannot be
checked.
"""
from __future__ import annotations

from typing import Any

import jax
import optax

from fkjax.sparsity import admm_pruning
from fkjax.sparsity import transforms
from fkjax.sparsity import wrappers

PyTree = Any

# The optimiser's transformation of the gradients (momentum, adaptive
# scaling): states whose place a piece is checked against.
_OPTIMISER = (optax.TraceState, optax.ScaleByAdamState,
              optax.ScaleByAmsgradState, optax.ScaleByRmsState,
              optax.ScaleByRssState, optax.ScaleByRStdDevState,
              optax.ScaleByBeliefState, optax.ScaleByLionState)
_SCALING = (optax.ScaleByScheduleState,)
_INJECTED = (optax.InjectHyperparamsState,
             optax.InjectStatefulHyperparamsState)
_SPLITS = (transforms.L0SplitState, transforms.GroupL0SplitState,
           admm_pruning.ADMMState)
_NAMES = {transforms.L0SplitState: "l0_split",
          transforms.GroupL0SplitState: "group_l0_split",
          admm_pruning.ADMMState: "admm_split",
          transforms.GroupLassoState: "group_lasso"}
_KNOWN = (*_OPTIMISER, *_SCALING, *_INJECTED, *_SPLITS,
          transforms.GroupLassoState, wrappers.SparsifiedState)

# A piece's kind: "before" (acts on gradients), "after" (scales itself),
# "before_scaling" (learning_rate=None); the optimiser's: "optimiser",
# "scaling".


def _kinds(node: PyTree) -> list[tuple[str, str]]:
  """``(kind, name)`` of the known states in ``node``, in the chain's order."""
  out = []
  for leaf in jax.tree.leaves(node, is_leaf=lambda x: isinstance(x, _KNOWN)):
    if isinstance(leaf, wrappers.SparsifiedState):
      # Its pieces are in place by construction: from outside, a wrapped
      # optimiser is an optimiser.
      out.append(("optimiser", "SparsifiedState"))
    elif isinstance(leaf, transforms.GroupLassoState):
      out.append(("before", "group_lasso"))
    elif isinstance(leaf, _SPLITS):
      kind = "after" if leaf.placement.scales_itself else "before_scaling"
      out.append((kind, _NAMES[type(leaf)]))
    elif isinstance(leaf, _OPTIMISER):
      out.append(("optimiser", type(leaf).__name__))
    elif isinstance(leaf, _SCALING):
      out.append(("scaling", type(leaf).__name__))
    elif isinstance(leaf, _INJECTED):
      inner = _kinds(leaf.inner_state)
      out += inner
      # An injected optimiser scales by its learning rate last.
      if ("learning_rate" in leaf.hyperparams
          and any(k == "optimiser" for k, _ in inner)):
        out.append(("scaling", "inject_hyperparams' learning_rate"))
  return out


def _wrong(kind: str, before: list[str], after: list[str]) -> str | None:
  """What is wrong with a piece of ``kind`` that has the optimiser's
  ``before`` kinds before it in its chain and ``after`` after it."""
  if kind == "before" and before:
    return ("acts on the gradients and runs after the optimiser; put it "
            "before")
  if kind == "after" and after:
    return ("scales itself by the learning rate and runs before the "
            "optimiser; put it after")
  if kind == "before_scaling" and "scaling" in before:
    return ("has learning_rate=None, so the learning-rate scaling must "
            "follow it, and it runs after it; put it between momentum and "
            "the scaling, or pass learning_rate")
  return None


def check_order(who: str, opt_state: PyTree) -> None:
  """Raises ValueError, in one line, for a piece in the wrong place.

  Looks at every ``optax.chain`` (a tuple of states) in ``opt_state``,
  nested ones included, and the pieces among its members.

  Args:
    who: the caller, for the message.
    opt_state: any optimiser state.
  """

  def visit(node):
    if type(node) is tuple:  # pylint: disable=unidiomatic-typecheck
      members = [_kinds(child) for child in node]
      for i, kinds in enumerate(members):
        for kind, name in kinds:
          if kind not in ("before", "after", "before_scaling"):
            continue
          others = lambda js: [k for j in js for k, _ in members[j]
                               if k in ("optimiser", "scaling")]
          problem = _wrong(kind, others(range(i)),
                           others(range(i + 1, len(members))))
          if problem:
            raise ValueError(
                f"fkjax.sparsity.{who}: in this optax.chain, {name} "
                f"{problem} (sparsity.rvsm / rgsm / admm(optimizer, ...) "
                "put every piece in its place).")
    children = jax.tree_util.tree_flatten(
        node, is_leaf=lambda x: x is not node)[0]
    if not (len(children) == 1 and children[0] is node):  # not a leaf
      for child in children:
        visit(child)

  visit(opt_state)
