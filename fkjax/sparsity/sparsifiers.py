"""One object per sparsification method: the registry a training loop uses.

A :class:`Sparsifier` holds a method's hyperparameters (validated when it is
built) and which parameters it acts on (``mask``, ``layout``), and owns
everything a training loop does with them::

    sp = sparsity.get_sparsifier("rgsm", beta=1.0, lamb1=5e-2, lamb2=1e-5)
    tx = sp.wrap(optax.sgd(schedule, momentum=0.9, nesterov=True),
                 learning_rate=schedule)
    opt_state = tx.init(params)
    for epoch in range(epochs):
      ...                                  # steps with tx
      params, opt_state = sp.end_of_epoch(params, opt_state)
      evaluated = sp.evaluated_params(params, opt_state)
      print(sp.report(evaluated).format_table(),
            sp.hparams_in_force(opt_state))

Every hyperparameter is a float or an optax schedule; what the optimiser's
state records as the values of the last step is what :meth:`end_of_epoch`,
:meth:`project` and :meth:`hparams_in_force` use when given ``opt_state``.

Adding a method is one subclass here, registered with :func:`register`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Optional

import jax
import optax

from fkjax.sparsity import admm_pruning
from fkjax.sparsity import checks
from fkjax.sparsity import layouts as layouts_lib
from fkjax.sparsity import masks
from fkjax.sparsity import metrics
from fkjax.sparsity import operators
from fkjax.sparsity import order
from fkjax.sparsity import transforms
from fkjax.sparsity import wrappers

PyTree = Any
GradientTransformation = optax.GradientTransformation

# name -> Sparsifier subclass, filled by @register.
METHODS: dict[str, type["Sparsifier"]] = {}


def register(cls: type["Sparsifier"]) -> type["Sparsifier"]:
  """Class decorator: adds a :class:`Sparsifier` subclass to :data:`METHODS`."""
  if cls.name in METHODS:
    raise ValueError(f"Sparsification method {cls.name!r} registered twice.")
  METHODS[cls.name] = cls
  return cls


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sparsifier(abc.ABC):
  """A sparsification method with its hyperparameters.

  Subclasses declare ``name``, ``hparam_names`` (every hyperparameter, in the
  order logs show them), ``optimizer_only`` (those only the optimizer uses;
  :meth:`project` does not need them) and ``config_keys`` (a hyperparameter's
  config key where it is not its name), as dataclass fields plus class
  attributes, and implement :meth:`wrap`, :meth:`before_sgd`,
  :meth:`after_sgd`, :meth:`_project_values` and :meth:`end_of_epoch`;
  ``in_state`` says which state class records each hyperparameter.

  Attributes:
    mask: which leaves are sparsified (see :mod:`fkjax.sparsity.masks`);
      default: convolution kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`); default:
      ``kernel`` leaves are ``HWIO`` (Flax), ``weight`` leaves ``OIHW``
      (Equinox). Say ``"MHWIO"`` for kernels whose axis 0 stacks ensemble
      members.
  """

  name: ClassVar[str]
  hparam_names: ClassVar[tuple[str, ...]] = ()
  optimizer_only: ClassVar[frozenset[str]] = frozenset()
  # hyperparameter -> its key in a config section, where the two differ
  # (the section is shared by all methods).
  config_keys: ClassVar[Mapping[str, str]] = {}
  # numeric hyperparameter -> the state class whose field of that name
  # records its value in force.
  in_state: ClassVar[Mapping[str, type]] = {}

  mask: masks.Mask = masks.CONV_KERNELS
  layout: layouts_lib.LayoutSpec = None

  def __post_init__(self):
    # A hashable, validated form of the layout argument; errors surface here.
    object.__setattr__(self, "layout", layouts_lib.normalize(self.layout))
    masks.mask_fn(self.mask, self.layout)
    for n in self.hparam_names:
      value = getattr(self, n)
      if value is not None:
        checks.check_hparam(self.name, n, value)

  @property
  def hparams(self) -> dict[str, Any]:
    """The method's hyperparameters by name (for logs and configs)."""
    return {n: getattr(self, n) for n in self.hparam_names}

  def _require(self, *names: str) -> None:
    missing = [n for n in names if getattr(self, n) is None]
    if missing:
      raise TypeError(
          f"fkjax.sparsity {self.name}: the optimizer needs "
          f"{', '.join(missing)}, which was not given."
      )

  # ------------------------------------------------------------ optimizer

  def wrap(
      self,
      inner: GradientTransformation,
      learning_rate: Optional[transforms.ScalarOrSchedule] = None,
  ) -> GradientTransformation:
    """The method around the optimiser ``inner``, as one transformation.

    See :func:`fkjax.sparsity.rvsm`: ``learning_rate`` is ``inner``'s (a
    float or a schedule), or left out when ``inner`` is built with
    ``optax.inject_hyperparams``. For ``"none"``: ``inner`` itself.
    """
    del learning_rate
    return inner

  def before_sgd(self) -> tuple[GradientTransformation, ...]:
    """Transformations of the gradients, before SGD (RGSM's group lasso)."""
    return ()

  def after_sgd(
      self, learning_rate: Optional[transforms.ScalarOrSchedule]
  ) -> tuple[GradientTransformation, ...]:
    """The splitting step(s), after SGD: pass SGD's learning rate.

    ``learning_rate=None`` gives the form that goes between momentum
    (``optax.trace``) and ``optax.scale_by_learning_rate`` instead (see
    :func:`fkjax.sparsity.l0_split`). :meth:`wrap` puts the pieces in place.
    """
    del learning_rate
    return ()

  def optimizer(
      self,
      learning_rate: transforms.ScalarOrSchedule,
      *,
      momentum: Optional[float] = 0.9,
      nesterov: bool = True,
      weight_decay: float = 5e-4,
  ) -> GradientTransformation:
    """The paper's optimiser: weight decay, then SGD wrapped by the method.

    ``optax.chain(add_decayed_weights(weight_decay), self.wrap(sgd(
    learning_rate, momentum, nesterov), learning_rate))``: the weight decay
    (on every parameter, as PyTorch's SGD does) comes first, then
    :meth:`before_sgd`, SGD, :meth:`after_sgd`.

    Args:
      learning_rate: float or schedule, shared by SGD and the splitting step.
      momentum: SGD momentum (0 or None for plain SGD).
      nesterov: Nesterov momentum.
      weight_decay: L2 coefficient added to every gradient (0 disables it);
        may be traced.
    """
    checks.check_hparam(self.name, "learning_rate", learning_rate)
    for name, value in (("momentum", momentum),
                        ("weight_decay", weight_decay)):
      checks.check_number(f"{self.name}.optimizer", name, value)
    # A traced value (a sweep's per-run value) keeps its transform.
    traced = lambda x: isinstance(x, jax.core.Tracer)
    decay = ([optax.add_decayed_weights(weight_decay)]
             if traced(weight_decay) or weight_decay else [])
    sgd = optax.sgd(learning_rate,
                    momentum=momentum if traced(momentum) else momentum or None,
                    nesterov=nesterov)
    return optax.chain(*decay, self.wrap(sgd, learning_rate))

  # ------------------------------------------------------ per epoch / eval

  def hparams_in_force(self, opt_state: Optional[PyTree] = None
                       ) -> dict[str, Any]:
    """The hyperparameters by name, with the values in force.

    Args:
      opt_state: the state of an optimiser that holds this method (built by
        :meth:`wrap`, :meth:`optimizer`, the pieces, under any optax wrapper,
        ``inject_hyperparams`` included): its numeric hyperparameters are
        the values its last update used. None: this sparsifier's own
        values, which must then be numbers.

    Raises:
      ValueError: ``opt_state`` holds no state of this method, or several,
        or a chain of pieces in the wrong order
        (:func:`fkjax.sparsity.order.check_order`).
      TypeError: no ``opt_state`` and a hyperparameter is a schedule.
    """
    values = dict(self.hparams)
    if opt_state is None:
      for name in set(self.in_state) - self.optimizer_only:
        checks.check_number(self.name, name, values[name])
      return values
    order.check_order(self.name, opt_state)
    for name, cls in self.in_state.items():
      found = _states_of(cls, opt_state)
      if not found and name in self.optimizer_only:
        continue  # a chain of pieces without it: project does not need it
      if len(found) != 1:
        raise ValueError(
            f"fkjax.sparsity {self.name}: the optimiser state holds "
            f"{len(found) or 'no'} {cls.__name__}"
            + (": pass the state of the optimiser this sparsifier built "
               f"(wrap / optimizer)." if not found else
               "s; pass the state of one optimiser."))
      values[name] = _value(getattr(found[0], name))
    return values

  def project(self, params: PyTree, opt_state: Optional[PyTree] = None
              ) -> PyTree:
    """The sparse ``u`` for ``params`` (leaves outside the mask unchanged).

    With ``opt_state``, the hyperparameters its last update used (see
    :meth:`hparams_in_force`). Pure and jittable. Raises ValueError when the
    mask selects nothing.
    """
    return self._project_values(params, self.hparams_in_force(opt_state))

  @abc.abstractmethod
  def _project_values(self, params: PyTree, hparams: Mapping[str, Any]
                      ) -> PyTree:
    """The sparse ``u`` of ``params`` with these hyperparameter values."""

  def end_of_epoch(
      self, params: PyTree, opt_state: PyTree
  ) -> tuple[PyTree, PyTree]:
    """The paper's per-epoch step; returns ``(params, opt_state)``.

    Uses the hyperparameters in force in ``opt_state``. Pure and jittable.
    """
    return params, opt_state

  def evaluated_params(self, params: PyTree,
                       opt_state: Optional[PyTree] = None) -> PyTree:
    """The parameters the paper evaluates: the sparse u, :meth:`project`."""
    return self.project(params, opt_state)

  def report(
      self, params: PyTree, group: Optional[operators.Group] = None
  ) -> metrics.SparsityReport:
    """:func:`fkjax.sparsity.sparsity_report` with this mask and layout.

    Args:
      params: the parameters, e.g. :meth:`evaluated_params`.
      group: channel grouping; default: the method's ``group`` if it has one,
        else ``"input"``.
    """
    if group is None:
      group = getattr(self, "group", "input")
    return metrics.sparsity_report(params, mask=self.mask, group=group,
                                   layout=self.layout)

  # ------------------------------------------------------------- helpers

  def _project_with(self, params: PyTree, prox: Callable[..., Any],
                    need_layout: bool) -> PyTree:
    """``prox(w, layout)`` on the selected leaves, the others unchanged."""
    who = f"{self.name}.project"
    keep = masks.select(who, self.mask, params, self.layout)
    return layouts_lib.tree_map_with_layouts(
        who, prox, self.layout, params, keep=keep, need_layout=need_layout)


def _states_of(cls: type, tree: PyTree) -> list[Any]:
  """Every node of type ``cls`` in ``tree``."""
  found = []
  jax.tree.map(lambda n: found.append(n) if isinstance(n, cls) else None,
               tree, is_leaf=lambda n: isinstance(n, cls))
  return found


def _value(x: Any) -> Any:
  """A recorded value: the array, also from a Flax NNX ``Variable``."""
  return x.get_value() if hasattr(x, "get_value") else x


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class NoSparsity(Sparsifier):
  """Plain SGD: nothing is sparsified, the parameters are evaluated as is."""

  name: ClassVar[str] = "none"

  def _project_values(self, params, hparams):
    return params


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RVSM(Sparsifier):
  """RVSM (Algorithm 1): unstructured ℓ0 pruning, threshold ``sqrt(2λ/β)``.

  Attributes:
    beta: splitting weight β > 0.
    lamb: ℓ0 weight λ ≥ 0.
  """

  name: ClassVar[str] = "rvsm"
  hparam_names: ClassVar[tuple[str, ...]] = ("beta", "lamb")
  in_state: ClassVar[Mapping[str, type]] = {
      "beta": transforms.L0SplitState, "lamb": transforms.L0SplitState}

  beta: transforms.ScalarOrSchedule
  lamb: transforms.ScalarOrSchedule

  def wrap(self, inner, learning_rate=None):
    return wrappers.rvsm(inner, beta=self.beta, lamb=self.lamb,
                         learning_rate=learning_rate, mask=self.mask,
                         layout=self.layout)

  def after_sgd(self, learning_rate):
    return (transforms.l0_split(self.beta, self.lamb, learning_rate,
                                mask=self.mask, layout=self.layout),)

  def _project_values(self, params, hparams):
    gamma = operators.l0_threshold(hparams["lamb"], hparams["beta"])
    return self._project_with(
        params, lambda w, _: operators.hard_threshold(w, gamma),
        need_layout=False)

  def end_of_epoch(self, params, opt_state):
    # The paper replaces w by its sparse u at every epoch's end.
    return self.project(params, opt_state), opt_state


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RGSM(Sparsifier):
  """RGSM (Algorithm 2): channel pruning by group ℓ0 plus group lasso.

  Attributes:
    beta: splitting weight β > 0.
    lamb1: group-ℓ0 weight λ1 ≥ 0; a channel is kept iff its norm is
      ``> sqrt(2 λ1 / β)``.
    lamb2: group-lasso weight λ2 ≥ 0 (optimizer only; may be left out for
      :meth:`project`).
    group: channel grouping, ``"input"`` (the authors'), ``"output"`` or axes.
  """

  name: ClassVar[str] = "rgsm"
  hparam_names: ClassVar[tuple[str, ...]] = ("beta", "lamb1", "lamb2", "group")
  optimizer_only: ClassVar[frozenset[str]] = frozenset({"lamb2"})
  in_state: ClassVar[Mapping[str, type]] = {
      "beta": transforms.GroupL0SplitState,
      "lamb1": transforms.GroupL0SplitState,
      "lamb2": transforms.GroupLassoState}

  beta: transforms.ScalarOrSchedule
  lamb1: transforms.ScalarOrSchedule
  lamb2: Optional[transforms.ScalarOrSchedule] = None
  group: operators.Group = "input"

  def __post_init__(self):
    super().__post_init__()
    operators.check_group(self.group)

  def wrap(self, inner, learning_rate=None):
    self._require("lamb2")
    return wrappers.rgsm(inner, beta=self.beta, lamb1=self.lamb1,
                         lamb2=self.lamb2, learning_rate=learning_rate,
                         group=self.group, mask=self.mask, layout=self.layout)

  def before_sgd(self):
    self._require("lamb2")
    return (transforms.group_lasso(self.lamb2, group=self.group,
                                   mask=self.mask, layout=self.layout),)

  def after_sgd(self, learning_rate):
    return (transforms.group_l0_split(self.beta, self.lamb1, learning_rate,
                                      group=self.group, mask=self.mask,
                                      layout=self.layout),)

  def _project_values(self, params, hparams):
    return self._project_with(
        params,
        lambda w, layout: operators.group_l0_prox(
            w, hparams["lamb1"], hparams["beta"], self.group, layout),
        need_layout=isinstance(self.group, str))

  def end_of_epoch(self, params, opt_state):
    return self.project(params, opt_state), opt_state


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class ADMM(Sparsifier):
  """ADMM pruning, the paper's baseline: ``percent`` % of each layer zeroed.

  Attributes:
    rho: ADMM penalty ρ > 0 (optimizer only).
    percent: % of each layer's entries (or channels) pruned, in [0, 100].
    structure: ``"element"`` or ``"channel"``.
    group: channel grouping for ``"channel"``.
    variant: ``"exact"`` (exactly ``percent`` % zeroed, the pull added once)
      or ``"authors"`` (the authors' released code: their projection, which
      zeroes fewer, and the pull added once per pruned layer for every
      layer); see :func:`fkjax.sparsity.admm`. Config key ``admm_variant``.
  """

  name: ClassVar[str] = "admm"
  hparam_names: ClassVar[tuple[str, ...]] = (
      "rho", "percent", "structure", "group", "variant")
  optimizer_only: ClassVar[frozenset[str]] = frozenset({"rho"})
  config_keys: ClassVar[Mapping[str, str]] = {"variant": "admm_variant"}
  in_state: ClassVar[Mapping[str, type]] = {
      "rho": admm_pruning.ADMMState, "percent": admm_pruning.ADMMState}

  rho: Optional[transforms.ScalarOrSchedule] = None
  percent: transforms.ScalarOrSchedule
  structure: str = "element"
  group: operators.Group = "input"
  variant: str = "exact"

  def __post_init__(self):
    super().__post_init__()
    operators.check_structure(self.structure)
    operators.check_group(self.group)
    operators.check_variant(self.variant)

  def wrap(self, inner, learning_rate=None):
    self._require("rho")
    return wrappers.admm(inner, rho=self.rho, percent=self.percent,
                         learning_rate=learning_rate,
                         structure=self.structure, group=self.group,
                         mask=self.mask, layout=self.layout,
                         variant=self.variant)

  def after_sgd(self, learning_rate):
    self._require("rho")
    return (admm_pruning.admm_split(
        self.rho, self.percent, learning_rate, structure=self.structure,
        group=self.group, mask=self.mask, layout=self.layout,
        variant=self.variant),)

  def _project_values(self, params, hparams):
    # Proj(w): exactly `percent` % sparse by construction ("exact").
    return self._project_with(
        params,
        lambda w, layout: operators.admm_projection(
            w, hparams["percent"], self.structure, self.group, layout,
            self.variant),
        need_layout=(self.structure == "channel"
                     and isinstance(self.group, str)))

  def end_of_epoch(self, params, opt_state):
    # w stays dense during training; z, u restart from Proj(w), 0, with the
    # percent each ADMM state records.
    order.check_order(self.name, opt_state)
    return params, admm_pruning.admm_reset(opt_state, params)


def _unknown_method(name: Any) -> ValueError:
  return ValueError(
      f"Unknown sparsification method {name!r}; expected one of "
      f"{', '.join(repr(m) for m in METHODS)}."
  )


def get_sparsifier(
    name: str,
    *,
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
    **hparams: Any,
) -> Sparsifier:
  """The :class:`Sparsifier` of method ``name`` with these hyperparameters.

  Args:
    name: ``"none"``, ``"rvsm"``, ``"rgsm"``, ``"admm"`` (the keys of
      :data:`METHODS`).
    mask: which leaves are sparsified; default: convolution kernels.
    layout: the kernels' layouts (see :mod:`fkjax.sparsity.layouts`).
    **hparams: the method's hyperparameters (its ``hparam_names``).

  Raises:
    ValueError: for an unknown method or an invalid value (naming the
      hyperparameter, the value and the valid range).
    TypeError: for a missing or unexpected hyperparameter.
  """
  if name not in METHODS:
    raise _unknown_method(name)
  cls = METHODS[name]
  unexpected = sorted(set(hparams) - set(cls.hparam_names))
  if unexpected:
    accepted = ", ".join(cls.hparam_names) or "none"
    raise TypeError(
        f"fkjax.sparsity {name}: unexpected hyperparameter(s) "
        f"{', '.join(unexpected)}; it takes: {accepted}."
    )
  try:
    return cls(mask=mask, layout=layout, **hparams)
  except TypeError as e:
    if "missing" in str(e):
      raise TypeError(f"fkjax.sparsity {name}: {e}") from None
    raise


def from_config(
    section: Mapping[str, Any],
    *,
    mask: masks.Mask = masks.CONV_KERNELS,
    layout: layouts_lib.LayoutSpec = None,
) -> Sparsifier:
  """The sparsifier a config section describes.

  ``section["method"]`` names the method; its hyperparameters are read from
  the section by name (or by the method's ``config_keys``, e.g. ADMM's
  ``variant`` from ``admm_variant``), and the section's other keys (other
  methods') are ignored. Works with a dict or an ``ml_collections.ConfigDict``.
  """
  method = section["method"]
  if method not in METHODS:
    raise _unknown_method(method)
  cls = METHODS[method]
  keys = {n: cls.config_keys.get(n, n) for n in cls.hparam_names}
  return get_sparsifier(method, mask=mask, layout=layout,
                        **{n: section[k] for n, k in keys.items()
                           if k in section})
