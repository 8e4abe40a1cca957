"""The sparsifiers as one optax transformation wrapping the optimiser, and
every hyperparameter as a float or an optax schedule.

* ``rvsm`` / ``rgsm`` / ``admm`` (inner optimiser) give the documented chain
  of pieces' numbers, with the learning rate as a float, a schedule, or read
  from the inner state's ``inject_hyperparams``; a missing or twice-given
  learning rate is refused at ``init``.
* Each hyperparameter of each method, scheduled (given to the wrapper, to
  ``get_sparsifier`` or injected by ``optax.inject_hyperparams``), trains as
  the fixed values in force step by step, and ``end_of_epoch``, ``project``
  and ``hparams_in_force`` use the value of the last step.
"""
import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fkjax import sparsity as sp
from tests.sparsity_params import make_params as make_test_params

LAYOUT = "HWIO"


def make_params():
  """One conv kernel whose channels the tests' values prune, and a dense
  layer the mask leaves alone (small: the tests compile nothing)."""
  params = make_test_params()
  return {"Conv_0": params["Conv_0"], "Dense_0": params["Dense_0"]}


HPARAMS = {
    "rvsm": {"beta": 0.5, "lamb": 2e-3},
    "rgsm": {"beta": 0.5, "lamb1": 6.25e-2, "lamb2": 1e-2},
    "admm": {"rho": 0.3, "percent": 50.0},
}
# Each hyperparameter's value after the switch (step SWITCH on).
LATER = {"beta": 0.25, "lamb": 8e-3, "lamb1": 0.125, "lamb2": 0.05,
         "rho": 0.6, "percent": 75.0}
SWITCH, STEPS = 2, 3
WRAPPERS = {"rvsm": sp.rvsm, "rgsm": sp.rgsm, "admm": sp.admm}
PIECES = {
    "rvsm": lambda hp, lr: ((), (sp.l0_split(hp["beta"], hp["lamb"], lr,
                                             layout=LAYOUT),)),
    "rgsm": lambda hp, lr: (
        (sp.group_lasso(hp["lamb2"], layout=LAYOUT),),
        (sp.group_l0_split(hp["beta"], hp["lamb1"], lr, layout=LAYOUT),)),
    "admm": lambda hp, lr: ((), (sp.admm_split(hp["rho"], hp["percent"], lr,
                                               layout=LAYOUT),)),
}
SCHEDULE = optax.piecewise_constant_schedule(0.2, {SWITCH: 0.5})


def sgd(lr):
  return optax.sgd(lr, momentum=0.9, nesterov=True)


def grads(seed=1):
  rng = np.random.default_rng(seed)
  return [jax.tree.map(lambda x: 0.05 * rng.standard_normal(x.shape).astype(
      np.float32), make_params()) for _ in range(STEPS)]


def train(tx, gs=None, state=None, params=None):
  params = make_params() if params is None else params
  state = tx.init(params) if state is None else state
  for g in grads() if gs is None else gs:
    u, state = tx.update(g, state, params)
    params = optax.apply_updates(params, u)
  return params, state


# ------------------------------------------ item: one wrapper, one lr


@pytest.mark.parametrize("method", sorted(WRAPPERS))
@pytest.mark.parametrize("lr_form", ["float", "schedule", "injected"])
def test_wrapper_gives_the_documented_chain(method, lr_form):
  hp = HPARAMS[method]
  lr = 0.1 if lr_form == "float" else SCHEDULE
  before, after = PIECES[method](hp, lr)
  chain = optax.chain(*before, sgd(lr), *after)
  if lr_form == "injected":
    inner = optax.inject_hyperparams(optax.sgd)(
        learning_rate=SCHEDULE, momentum=0.9, nesterov=True)
    tx = WRAPPERS[method](inner, layout=LAYOUT, **hp)
  else:
    tx = WRAPPERS[method](sgd(lr), learning_rate=lr, layout=LAYOUT, **hp)
  got, state = train(tx)
  want, _ = train(chain)
  chex.assert_trees_all_equal(got, want)
  assert isinstance(state, sp.SparsifiedState)
  assert not np.array_equal(got["Conv_0"]["kernel"],
                            train(sgd(lr))[0]["Conv_0"]["kernel"])


def test_wrapper_state_holds_the_inner_optimisers():
  params = make_params()
  inner = sgd(0.1)
  state = sp.rgsm(inner, learning_rate=0.1, layout=LAYOUT,
                  **HPARAMS["rgsm"]).init(params)
  chex.assert_trees_all_equal(state.inner, inner.init(params))
  assert isinstance(optax.tree_utils.tree_get(state.before, "GroupLassoState"),
                    sp.GroupLassoState)
  assert isinstance(optax.tree_utils.tree_get(state.after,
                                              "GroupL0SplitState"),
                    sp.GroupL0SplitState)


@pytest.mark.parametrize("method", sorted(WRAPPERS))
def test_a_missing_or_twice_given_learning_rate_is_refused(method):
  params = make_params()
  hp = dict(HPARAMS[method], layout=LAYOUT)
  with pytest.raises(ValueError, match=rf"^fkjax.sparsity.{method}: no "
                     r"learning rate: pass learning_rate=") as e:
    WRAPPERS[method](sgd(0.1), **hp).init(params)
  assert "\n" not in str(e.value)
  injected = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
  with pytest.raises(ValueError, match="learning rate is given twice"):
    WRAPPERS[method](injected, learning_rate=0.1, **hp).init(params)
  with pytest.raises(TypeError, match=r"the first argument is the optimiser"):
    WRAPPERS[method](0.1, **hp)
  with pytest.raises(ValueError, match="needs the current parameters"):
    tx = WRAPPERS[method](sgd(0.1), learning_rate=0.1, **hp)
    tx.update(params, tx.init(params))


# --------------------------------- item: every hyperparameter a schedule

CASES = [(m, name) for m in sorted(HPARAMS) for name in HPARAMS[m]]


def scheduled(method, name):
  """The method's values with ``name`` switching to LATER at SWITCH."""
  before = HPARAMS[method][name]
  return dict(HPARAMS[method], **{name: optax.piecewise_constant_schedule(
      before, {SWITCH: LATER[name] / before})})


@functools.cache
def reference(method, name):
  """Fixed values: the first ones for SWITCH steps, then the later ones,
  the same optimiser state carried over."""
  gs = grads()
  first = sp.get_sparsifier(method, layout=LAYOUT, **HPARAMS[method])
  then = sp.get_sparsifier(method, layout=LAYOUT,
                           **dict(HPARAMS[method], **{name: LATER[name]}))
  params, state = train(first.optimizer(0.1), gs[:SWITCH])
  params, state = train(then.optimizer(0.1), gs[SWITCH:], state, params)
  return params, state, then


@pytest.mark.parametrize("method,name", CASES)
@pytest.mark.parametrize("how", ["get_sparsifier", "wrapper",
                                 "inject_hyperparams", "sparse_sgd"])
def test_every_hyperparameter_takes_a_schedule(method, name, how):
  hp = scheduled(method, name)
  if how == "get_sparsifier":
    tx = sp.get_sparsifier(method, layout=LAYOUT, **hp).optimizer(0.1)
  elif how == "wrapper":
    tx = optax.chain(optax.add_decayed_weights(5e-4), WRAPPERS[method](
        sgd(0.1), learning_rate=0.1, layout=LAYOUT, **hp))
  elif how == "inject_hyperparams":
    tx = optax.chain(
        optax.add_decayed_weights(5e-4),
        optax.inject_hyperparams(WRAPPERS[method])(
            sgd(0.1), learning_rate=0.1, layout=LAYOUT, **hp))
  else:
    tx = optax.inject_hyperparams(sp.sparse_sgd)(method, 0.1, layout=LAYOUT,
                                                 **hp)
  got, state = train(tx)
  want, want_state, then = reference(method, name)
  chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)

  # The state says the value in force; the epoch's end and the projection
  # use it, whatever the sparsifier that reads it was given.
  fixed = sp.get_sparsifier(method, layout=LAYOUT, **HPARAMS[method])
  in_force = fixed.hparams_in_force(state)
  assert float(in_force[name]) == pytest.approx(LATER[name], rel=1e-6)
  got_end = fixed.end_of_epoch(got, state)
  want_end = then.end_of_epoch(want, want_state)
  chex.assert_trees_all_close(got_end[0], want_end[0], rtol=1e-6, atol=1e-7)
  if method == "admm":  # z = Proj(w) with the percent in force
    z = lambda st: optax.tree_utils.tree_get(st, "ADMMState").z
    chex.assert_trees_all_close(z(got_end[1]), z(want_end[1]), rtol=1e-6,
                                atol=1e-7)
  chex.assert_trees_all_close(
      sp.project(got, method, layout=LAYOUT, opt_state=state,
                 **HPARAMS[method]),
      then.project(want), rtol=1e-6, atol=1e-7)


def test_the_value_in_force_changes_what_is_pruned():
  # Not vacuous: the later beta (lower) prunes more than the first.
  hp = scheduled("rvsm", "beta")
  s = sp.get_sparsifier("rvsm", layout=LAYOUT, **hp)
  params, state = train(s.optimizer(0.1))
  fixed = sp.get_sparsifier("rvsm", layout=LAYOUT, **HPARAMS["rvsm"])
  zeros = lambda p: int(jnp.sum(p["Conv_0"]["kernel"] == 0))
  assert zeros(s.project(params, state)) > zeros(fixed.project(params))


def test_a_callable_where_a_number_is_needed_is_refused_in_one_line():
  params = make_params()
  with pytest.raises(TypeError, match=r"^fkjax.sparsity rvsm: beta is the "
                     r"callable .* not an optax schedule") as e:
    sp.get_sparsifier("rvsm", beta=lambda: 0.5, lamb=1e-3)
  assert "\n" not in str(e.value)
  with pytest.raises(TypeError, match=r"lamb1 is a schedule whose value at "
                     r"step 0 has shape \(2,\)"):
    sp.rgsm(sgd(0.1), beta=0.5, lamb1=lambda t: jnp.ones(2), lamb2=0.0,
            learning_rate=0.1)
  with pytest.raises(ValueError, match=re.escape(
      "percent=150.0 is out of range")):
    sp.admm(sgd(0.1), rho=0.5, percent=lambda t: 150.0 + t,
            learning_rate=0.1)
  # A projection without the optimiser's state has no value for a schedule.
  with pytest.raises(TypeError, match=r"^fkjax.sparsity rvsm: beta is a "
                     r"schedule, and this needs the number in force") as e:
    sp.project(params, "rvsm", beta=lambda t: 0.5, lamb=1e-3)
  assert "\n" not in str(e.value)
  with pytest.raises(TypeError, match="weight_decay is a schedule"):
    sp.get_sparsifier("none").optimizer(0.1, weight_decay=lambda t: 1e-4)


def test_hparams_in_force_wants_exactly_one_state_of_the_method():
  params = make_params()
  s = sp.get_sparsifier("rvsm", layout=LAYOUT, **HPARAMS["rvsm"])
  with pytest.raises(ValueError, match="holds no L0SplitState"):
    s.end_of_epoch(params, optax.sgd(0.1).init(params))
  two = optax.chain(s.optimizer(0.1), s.optimizer(0.1)).init(params)
  with pytest.raises(ValueError, match="holds 2 L0SplitStates"):
    s.hparams_in_force(two)


# ------------------------------- the pieces refuse the wrong order


def _chain_of_pieces(method, where):
  """The method's pieces around SGD with momentum and a scheduled learning
  rate: as documented, or in one of the wrong places."""
  s = sp.get_sparsifier(method, layout=LAYOUT, **HPARAMS[method])
  before, after = s.before_sgd(), s.after_sgd(SCHEDULE)
  if where == "documented":
    return s, optax.chain(*before, sgd(SCHEDULE), *after)
  if where == "documented, learning_rate=None":
    return s, optax.chain(*before, optax.trace(0.9, nesterov=True),
                          *s.after_sgd(None),
                          optax.scale_by_learning_rate(SCHEDULE))
  if where == "splitting step before the optimiser":
    return s, optax.chain(*before, *after, sgd(SCHEDULE))
  if where == "learning_rate=None after the scaling":
    return s, optax.chain(*before, sgd(SCHEDULE), *s.after_sgd(None))
  assert where == "group lasso after the optimiser"
  return s, optax.chain(sgd(SCHEDULE), *before, *after)


@pytest.mark.parametrize("method,where,error", [
    *[(m, "documented", None) for m in ("rvsm", "rgsm", "admm")],
    *[(m, "documented, learning_rate=None", None)
      for m in ("rvsm", "rgsm", "admm")],
    *[(m, "splitting step before the optimiser", "runs before the optimiser")
      for m in ("rvsm", "rgsm", "admm")],
    *[(m, "learning_rate=None after the scaling",
       "has learning_rate=None, so the learning-rate scaling must follow it")
      for m in ("rvsm", "rgsm", "admm")],
    ("rgsm", "group lasso after the optimiser",
     "group_lasso acts on the gradients and runs after the optimiser"),
])
def test_a_chain_of_pieces_in_the_wrong_order_is_refused(method, where, error):
  s, tx = _chain_of_pieces(method, where)
  params = make_params()
  state = tx.init(params)
  if error is None:
    s.end_of_epoch(params, state)
    return
  with pytest.raises(ValueError, match=re.escape(error)) as e:
    s.end_of_epoch(params, state)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=re.escape(error)):
    s.hparams_in_force(state)
