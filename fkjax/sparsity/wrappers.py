"""RVSM, RGSM and ADMM as one optax transformation each, wrapping the
optimiser they sparsify.

Each method's pieces go at fixed places around the optimiser: RGSM's group
lasso acts on the gradients before it, every method's splitting step on its
scaled update after it, with its learning rate. A wrapper puts them there,
so the order cannot be given wrong::

    tx = sparsity.rgsm(
        optax.inject_hyperparams(optax.sgd)(learning_rate=schedule,
                                            momentum=0.9, nesterov=True),
        beta=1.0, lamb1=5e-2, lamb2=1e-5)

The splitting step scales itself by the optimiser's learning rate (it is
outside momentum, as in the authors' code). It is read once: from
``learning_rate=`` (a float or a schedule, the optimiser's), or, when that is
left out, from the inner optimiser's state, where ``optax.inject_hyperparams``
keeps the ``learning_rate`` of the step. Neither, or both, is refused at
``init``. Every hyperparameter is a float or an optax schedule, and the
wrappers work under ``optax.inject_hyperparams`` too.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import optax

from fkjax.sparsity import admm_pruning
from fkjax.sparsity import checks
from fkjax.sparsity import layouts as layouts_lib
from fkjax.sparsity import masks
from fkjax.sparsity import operators
from fkjax.sparsity import transforms

PyTree = Any
_INJECTED = (optax.InjectHyperparamsState,
             optax.InjectStatefulHyperparamsState)


class SparsifiedState(NamedTuple):
  """State of a wrapper: its pieces' and the inner optimiser's.

  Attributes:
    before: the states of the pieces that act before the optimiser (RGSM's
      :class:`~fkjax.sparsity.GroupLassoState`), a tuple.
    inner: the inner optimiser's state.
    after: the splitting step's state (an
      :class:`~fkjax.sparsity.L0SplitState`,
      :class:`~fkjax.sparsity.GroupL0SplitState` or
      :class:`~fkjax.sparsity.ADMMState`, inside ``optax.MaskedState``
      when masked).
  """

  before: tuple[Any, ...]
  inner: Any
  after: Any


def injected_learning_rates(state: PyTree) -> list[Any]:
  """The ``learning_rate`` of every ``optax.inject_hyperparams`` state in
  ``state`` (outermost ones; the values of the last update)."""
  found = []

  def visit(node):
    if isinstance(node, _INJECTED) and "learning_rate" in node.hyperparams:
      found.append(node.hyperparams["learning_rate"])
    return node

  jax.tree.map(visit, state, is_leaf=lambda x: isinstance(x, _INJECTED))
  return found


def _check_learning_rate(who: str, given: Any, inner_state: PyTree) -> None:
  injected = injected_learning_rates(inner_state)
  if given is None and not injected:
    raise ValueError(
        f"fkjax.sparsity.{who}: no learning rate: pass learning_rate= (the "
        "inner optimiser's float or schedule), or build the optimiser with "
        "optax.inject_hyperparams so that it is read from its state.")
  if given is not None and injected:
    raise ValueError(
        f"fkjax.sparsity.{who}: the learning rate is given twice: the inner "
        "optimiser injects one (optax.inject_hyperparams) and "
        "learning_rate= is passed; leave learning_rate= out.")
  if len(injected) > 1:
    raise ValueError(
        f"fkjax.sparsity.{who}: the inner optimiser injects "
        f"{len(injected)} learning rates; pass the one the splitting step "
        "scales by as learning_rate=.")


def sparsified(
    who: str,
    inner: optax.GradientTransformation,
    before: Sequence[optax.GradientTransformation],
    after: Callable[[Any], optax.GradientTransformation],
    learning_rate: Optional[transforms.ScalarOrSchedule],
) -> optax.GradientTransformationExtraArgs:
  """``before`` → ``inner`` → ``after(learning_rate)`` as one transformation.

  Args:
    who: the method, for messages.
    inner: the optimiser (any ``optax.GradientTransformation``).
    before: the pieces that act on the gradients, before ``inner``.
    after: the splitting step, given the learning rate (a float, a schedule,
      or the step's value read from the inner state).
    learning_rate: a float or a schedule; None reads it from the inner
      state's ``optax.inject_hyperparams``.

  Returns:
    A transformation with a :class:`SparsifiedState`.
  """
  if not isinstance(inner, optax.GradientTransformation):
    raise TypeError(
        f"fkjax.sparsity.{who}: the first argument is the optimiser to "
        f"sparsify (an optax.GradientTransformation, e.g. optax.sgd(0.1, "
        f"momentum=0.9)), got {type(inner).__name__}; the hyperparameters "
        "are keywords.")
  checks.check_hparam(who, "learning_rate", learning_rate)
  before = tuple(before)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    inner_state = inner.init(params)
    _check_learning_rate(who, learning_rate, inner_state)
    # The splitting step's state does not depend on the learning rate.
    return SparsifiedState(
        before=tuple(t.init(params) for t in before),
        inner=inner_state,
        after=after(0.0 if learning_rate is None else learning_rate
                    ).init(params))

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(
          f"fkjax.sparsity.{who} needs the current parameters: call "
          "`update(updates, state, params)`.")
    before_states = []
    for t, s in zip(before, state.before):
      updates, s = t.update(updates, s, params)
      before_states.append(s)
    updates, inner_state = inner.update(updates, state.inner, params,
                                        **extra_args)
    lr = learning_rate
    if lr is None:  # one value, checked at init
      lr, = injected_learning_rates(inner_state)
    updates, after_state = after(lr).update(updates, state.after, params)
    return updates, SparsifiedState(tuple(before_states), inner_state,
                                    after_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def rvsm(
    inner: optax.GradientTransformation,
    *,
    beta: transforms.ScalarOrSchedule,
    lamb: transforms.ScalarOrSchedule,
    learning_rate: Optional[transforms.ScalarOrSchedule] = None,
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformationExtraArgs:
  """RVSM (Algorithm 1, unstructured ℓ0 pruning) around the optimiser.

  ``inner`` then :func:`~fkjax.sparsity.l0_split`, which adds
  ``−η_t β (w − u)``, ``u = H_{sqrt(2λ/β)}(w)``, to its update.

  Args:
    inner: the optimiser, e.g. ``optax.sgd(0.1, momentum=0.9,
      nesterov=True)``; ``update`` needs ``params``.
    beta: splitting weight β > 0, a float or a schedule.
    lamb: ℓ0 weight λ ≥ 0, a float or a schedule.
    learning_rate: the optimiser's learning rate, a float or a schedule;
      leave it out when ``inner`` is built with ``optax.inject_hyperparams``
      (it is read from its state).
    mask: which leaves to sparsify; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).

  Returns:
    An ``optax.GradientTransformation`` with a :class:`SparsifiedState`.

  Raises:
    ValueError: for a value out of range; at ``init``, for a missing or a
      twice-given learning rate, or a mask that selects nothing.
    TypeError: for a callable that is not a schedule.
  """
  checks.check_hparams("rvsm", beta=beta, lamb=lamb)
  return sparsified(
      "rvsm", inner, (),
      lambda lr: transforms.l0_split(beta, lamb, lr, mask=mask,
                                     layout=layout),
      learning_rate)


def rgsm(
    inner: optax.GradientTransformation,
    *,
    beta: transforms.ScalarOrSchedule,
    lamb1: transforms.ScalarOrSchedule,
    lamb2: transforms.ScalarOrSchedule,
    learning_rate: Optional[transforms.ScalarOrSchedule] = None,
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> optax.GradientTransformationExtraArgs:
  """RGSM (Algorithm 2, channel pruning) around the optimiser.

  :func:`~fkjax.sparsity.group_lasso` (λ2) on the gradients, then ``inner``,
  then :func:`~fkjax.sparsity.group_l0_split` (β, λ1): a channel group of
  ``u`` is kept iff its norm is ``> sqrt(2 λ1 / β)``.

  Args:
    inner: the optimiser; ``update`` needs ``params``.
    beta: splitting weight β > 0, a float or a schedule.
    lamb1: group-ℓ0 weight λ1 ≥ 0, a float or a schedule.
    lamb2: group-lasso weight λ2 ≥ 0, a float or a schedule.
    learning_rate: as in :func:`rvsm`.
    group: channel grouping, ``"input"`` (the authors'), ``"output"`` or
      axes.
    mask: which leaves to sparsify; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).

  Returns:
    An ``optax.GradientTransformation`` with a :class:`SparsifiedState`.
  """
  checks.check_hparams("rgsm", beta=beta, lamb1=lamb1, lamb2=lamb2)
  operators.check_group(group)
  return sparsified(
      "rgsm", inner,
      (transforms.group_lasso(lamb2, group=group, mask=mask, layout=layout),),
      lambda lr: transforms.group_l0_split(beta, lamb1, lr, group=group,
                                           mask=mask, layout=layout),
      learning_rate)


def admm(
    inner: optax.GradientTransformation,
    *,
    rho: transforms.ScalarOrSchedule,
    percent: transforms.ScalarOrSchedule,
    learning_rate: Optional[transforms.ScalarOrSchedule] = None,
    structure: str = "element",
    group: operators.Group = "input",
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
    variant: str = "exact",
) -> optax.GradientTransformationExtraArgs:
  """ADMM pruning (the paper's baseline) around the optimiser.

  ``inner`` then :func:`~fkjax.sparsity.admm_split`: ``z = Proj(w + u)``,
  ``u ← u + w − z``, and ``−η_t ρ (w − z + u)`` added to the update.

  Args:
    inner: the optimiser; ``update`` needs ``params``.
    rho: ADMM penalty ρ > 0, a float or a schedule.
    percent: % of each layer's entries (or channels) that ``z`` zeroes, in
      [0, 100], a float or a schedule.
    learning_rate: as in :func:`rvsm`.
    structure: ``"element"`` or ``"channel"``.
    group: channel grouping for ``"channel"``.
    mask: which leaves to prune; default: conv kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).
    variant: ``"exact"`` or ``"authors"`` (see
      :func:`~fkjax.sparsity.admm_split`).

  Returns:
    An ``optax.GradientTransformation`` with a :class:`SparsifiedState`.
  """
  checks.check_hparams("admm", rho=rho, percent=percent)
  operators.check_structure(structure)
  operators.check_group(group)
  operators.check_variant(variant)
  return sparsified(
      "admm", inner, (),
      lambda lr: admm_pruning.admm_split(
          rho, percent, lr, structure=structure, group=group, mask=mask,
          layout=layout, variant=variant),
      learning_rate)
