"""Progress of an evaluation in model calls: an optional layer.

An ``fkjax.evaluation.loop.Evaluator`` asked for progress hands its attacks the
model through ``counting_apply``, whose ``jax.debug.callback`` ticks a
host-side ``CallCounter`` on each call, and ``fkjax.workdir.metric_logging.progress``
shows ``batch 2/8, ifgsm20 call 13/21: 55/168 model calls``. A call
evaluated with ``vmap`` (the EOT draws of one gradient, a NAttack population
chunk) counts once. The expected counts come from the attack's traced
program (``count_model_calls``). Given each attack's work per image
(``work_per_image``, eval.py's forward passes), the display moves by work
units instead, each call weighing its attack's work over its calls, so that
its time-left estimate weighs expensive calls as such.

``CallCounting`` is the layer an ``Evaluator`` keeps (the counter, the
counted model, the counts expected and seen); ``CallCounting.show`` opens
the display of one evaluation, and ``SILENT`` stands in for it without
progress: the attacks are then compiled without the callback, the same
program, numbers and speed as before.

Per model call is a CPU's progress (``fkjax.kernels.platform``). On a GPU or
TPU a host callback in every model call would stop the device thousands of
times an image group (NAttack: a check and a population pass per
iteration), so there the attacks are compiled without it and the display
moves on the host between attacks, one step per attack and batch (weighed
by its work, given ``work_per_image``).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
from jax.extend import core as jax_core

from fkjax import attacks as attacks_lib
from fkjax import kernels
from fkjax.workdir import metric_logging


class CallCounter:
  """Counts model calls on the host, as ``counting_apply`` reports them.

  The callbacks arrive on a runtime thread while the main thread waits for
  the attack's result; ``listener(n)`` (set by ``watch``) sees every call.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._count = 0
    self._listener: Callable[[int], None] | None = None

  def tick(self) -> None:
    """One model call (the callback of ``counting_apply``)."""
    with self._lock:
      self._count += 1
      count, listener = self._count, self._listener
    if listener is not None:
      listener(count)

  def watch(self, listener: Callable[[int], None] | None) -> None:
    """Starts a new count, reported to ``listener`` (None: to no one)."""
    with self._lock:
      self._count = 0
      self._listener = listener

  @property
  def count(self) -> int:
    """Calls since the last ``watch``."""
    with self._lock:
      return self._count


def counting_apply(apply_fn: attacks_lib.ApplyFn,
                   tick: Callable[[], None]) -> attacks_lib.ApplyFn:
  """``apply_fn`` that calls ``tick()`` on the host each time it runs.

  The callback (``jax.debug.callback``, unordered, no operands) fires once
  per evaluation of the model in the compiled program: once per step of a
  ``lax.scan`` or ``fori_loop``, once for a whole ``vmap`` (it has no mapped
  operand), once for a ``jax.grad`` (forward pass only), and not at all in
  a ``lax.cond`` branch not taken. It changes no value.
  """
  def counted(variables, images, key):
    jax.debug.callback(tick, ordered=False)
    return apply_fn(variables, images, key)
  return counted


def count_model_calls(jaxpr: Any) -> int | None:
  """How often a program built on ``counting_apply`` ticks, from its jaxpr.

  Counts ``debug_callback`` equations: a ``scan`` multiplies its body's
  count by its length, a ``cond`` takes its largest branch (an upper bound:
  APGD skips a restart once every image is fooled). A ``while_loop`` whose
  body ticks counts its body's calls times its iteration limit where its
  condition is ``i < n and ...`` for a counter ``i`` from 0 by 1 and a
  constant ``n`` (an upper bound too: NAttack stops at ``max_iters`` or once
  every image is fooled); any other such loop has no count known in
  advance: None. Callbacks of the model itself (``jax.debug.print``) would
  count as calls too.

  Args:
    jaxpr: a ``Jaxpr`` or ``ClosedJaxpr`` (``jax.jit(f).trace(...).jaxpr``).

  Returns:
    The number of calls, or None if it depends on the data.
  """
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr's open jaxpr
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "debug_callback":
      total += 1
      continue
    inner = [count_model_calls(j)
             for j in jax_core.jaxprs_in_params(eqn.params)]
    if not inner:
      continue
    if name == "while":
      cond_calls = count_model_calls(eqn.params["cond_jaxpr"])
      body_calls = count_model_calls(eqn.params["body_jaxpr"])
      if cond_calls != 0 or body_calls is None:
        return None
      if body_calls:
        limit = _iteration_limit(eqn)
        if limit is None:
          return None
        total += limit * body_calls
    elif any(c is None for c in inner):
      return None
    elif name == "cond":
      total += max(inner)
    elif name == "scan":
      total += eqn.params["length"] * sum(inner)
    else:
      total += sum(inner)
  return total


def _iteration_limit(eqn: Any) -> int | None:
  """``n`` for a ``while`` equation whose condition is ``i < n`` (or that
  and more, joined by ``and``), ``n`` a constant and ``i`` a carried counter
  from 0 by 1: the most iterations it can run. None for any other loop."""
  params = eqn.params
  cond, body = params["cond_jaxpr"].jaxpr, params["body_jaxpr"].jaxpr
  cond_carry = cond.invars[params["cond_nconsts"]:]
  body_carry = body.invars[params["body_nconsts"]:]
  init = eqn.invars[params["cond_nconsts"] + params["body_nconsts"]:]
  producers = {out: e for e in cond.eqns for out in e.outvars}
  # The conjuncts of the condition: a bound on one bounds the loop.
  conjuncts, todo = [], [cond.outvars[0]]
  while todo:
    var = todo.pop()
    e = producers.get(var) if isinstance(var, jax_core.Var) else None
    if e is not None and e.primitive.name == "and":
      todo.extend(e.invars)
    else:
      conjuncts.append(e)
  limits = []
  for e in conjuncts:
    if (e is None or e.primitive.name != "lt"
        or not isinstance(e.invars[0], jax_core.Var)
        or not isinstance(e.invars[1], jax_core.Literal)
        or e.invars[0] not in cond_carry):
      continue
    index = cond_carry.index(e.invars[0])
    start = init[index]
    step = next((b for b in body.eqns if body.outvars[index] in b.outvars),
                None)
    if (isinstance(start, jax_core.Literal) and start.val == 0
        and step is not None and step.primitive.name == "add"
        and step.invars[0] is body_carry[index]
        and isinstance(step.invars[1], jax_core.Literal)
        and step.invars[1].val == 1):
      limits.append(max(int(e.invars[1].val), 0))
  return min(limits) if limits else None


class Display:
  """The progress line of one evaluation, in model calls.

  ``metric_logging.progress`` does the showing (tqdm on a terminal, a plain
  line every 30 s otherwise); this keeps its total and description current.
  """

  def __init__(self, desc: str, num_batches: int | None, enabled: bool,
               unit: str = "model call"):
    self._desc = desc
    self._num_batches = num_batches
    self._bar = metric_logging.progress(
        None, total=None, desc=desc, unit=unit, disable=not enabled)
    self._done = 0   # calls of the finished attacks
    self._batch = ""
    self._lock = threading.Lock()

  def compiling(self, batch_index: int, name: str) -> None:
    with self._lock:
      self._batch = self._batch_text(batch_index)
      self._bar.set_description(
          f"{self._desc}, {self._batch}, compiling {name}")

  def _batch_text(self, batch_index: int) -> str:
    of = f"/{self._num_batches}" if self._num_batches else ""
    return f"batch {batch_index + 1}{of}"

  def start_batch(self, batch_index: int, per_batch: int | None) -> None:
    """Re-estimates the total: done so far plus ``per_batch`` for this batch
    and each one after it (None: unknown)."""
    if self._num_batches is None or per_batch is None:
      total = None
    else:
      total = self._done + per_batch * max(self._num_batches - batch_index, 1)
    with self._lock:
      self._bar.total = total
      self._batch = self._batch_text(batch_index)

  def finished(self, name: str, weight: int) -> None:
    """Attack ``name`` finished its batch: the display moves by
    ``weight`` (progress between attacks, on accelerators)."""
    with self._lock:
      self._bar.set_description(f"{self._desc}, {self._batch}, {name} done",
                                refresh=False)
      self._bar.update(weight)

  def listener(self, name: str, expected: int | None, weight: int = 1
               ) -> Callable[[int], None]:
    """What a ``CallCounter`` reports the calls of attack ``name`` to;
    ``expected``: its calls on this batch, if known; ``weight``: how far
    one call moves the display."""
    prefix = f"{self._desc}, {self._batch}, {name}"
    of = f"/{expected}" if expected is not None else ""
    with self._lock:
      self._bar.set_description(prefix, refresh=False)

    def on_call(count: int) -> None:
      with self._lock:
        self._bar.set_description(f"{prefix} call {count}{of}",
                                  refresh=False)
        self._bar.update(weight)
    return on_call

  def attack_done(self, calls: int) -> None:
    with self._lock:
      self._done += calls

  def set_postfix(self, postfix: Mapping[str, str]) -> None:
    with self._lock:
      self._bar.set_postfix(postfix)

  def close(self) -> None:
    self._bar.close()


class CallCounting:
  """The progress layer of an evaluator: counts its attacks' model calls.

  Args:
    apply_fn: the model; ``self.apply_fn`` is it counted.
    work_per_image: each attack's cost per image in any unit (e.g. forward
      passes, ``fkjax.evaluation.cost.attack_costs``). Given, the progress moves
      by work units (one call of an attack weighs its work over its calls
      per batch), so that the time-left estimate does not take a cheap
      attack's calls for an expensive one's; None: by model calls.
    per_call: count every model call (a host callback in the compiled
      attacks), or move the display only between attacks (no callback);
      default: per call on a CPU only (:func:`fkjax.kernels.platform`).
  """

  def __init__(self, apply_fn: attacks_lib.ApplyFn,
               work_per_image: Mapping[str, float] | None = None,
               per_call: bool | None = None):
    self.calls = CallCounter()
    self.per_call = (kernels.platform() == "cpu" if per_call is None
                     else bool(per_call))
    # Between attacks the counted model is the model itself.
    self.apply_fn = (counting_apply(apply_fn, self.calls.tick)
                     if self.per_call else apply_fn)
    self.work_per_image = (dict(work_per_image) if work_per_image is not None
                           else None)
    # Expected model calls per (attack, batch shape), and the last count
    # seen (the estimate of an attack whose count is not known in advance).
    self._expected: dict[tuple[str, Any], int | None] = {}
    self._seen: dict[str, int] = {}

  def traced(self, name: str, signature: Any, traced: Any) -> None:
    """Records the calls attack ``name``'s traced program makes on a batch
    of ``signature`` (``jax.jit(...).trace(...)``); between attacks, one
    step per batch."""
    self._expected[(name, signature)] = (
        count_model_calls(traced.jaxpr) if self.per_call else 1)

  def show(self, names: Sequence[str], desc: str, num_batches: int | None,
           enabled: bool = True) -> "Shown":
    """The display of one evaluation over attacks ``names``."""
    unit = ("work unit" if self.work_per_image is not None
            else "model call" if self.per_call else "attack")
    return Shown(self, names, Display(desc, num_batches, enabled, unit=unit))

  def estimate(self, name: str, signature: Any) -> tuple[int | None,
                                                        int | None]:
    """``(expected, estimate)`` calls of ``name`` on a batch of
    ``signature``: the traced count (None: not known in advance), and it
    or else the count seen last time."""
    expected = self._expected.get((name, signature))
    return expected, expected if expected is not None else self._seen.get(
        name)

  def seen(self, name: str, count: int) -> None:
    """Attack ``name`` made ``count`` calls on its last batch."""
    self._seen[name] = count

  def weight(self, name: str, calls: int | None) -> int:
    """How far one model call of ``name`` moves the display (an integer,
    so that the display counts whole units)."""
    if self.work_per_image is None:
      return 1
    return max(1, round(self.work_per_image[name] / max(calls or 1, 1)))


class Shown:
  """One evaluation's progress: what ``Evaluator`` tells as it runs."""

  def __init__(self, counting: CallCounting, names: Sequence[str],
               display: Display):
    self._counting = counting
    self._names = list(names)
    self._display = display
    self._expected: dict[str, int | None] = {}
    self._weight: dict[str, int] = {}

  def compiling(self, batch_index: int, name: str) -> None:
    self._display.compiling(batch_index, name)

  def start_batch(self, batch_index: int, signature: Any) -> None:
    """A batch of ``signature`` starts: its calls are re-estimated."""
    c = self._counting
    both = {n: c.estimate(n, signature) for n in self._names}
    self._expected = {n: e for n, (e, _) in both.items()}
    estimates = {n: estimate for n, (_, estimate) in both.items()}
    self._weight = {n: c.weight(n, estimates[n]) for n in self._names}
    self._display.start_batch(
        batch_index, None if None in estimates.values()
        else sum(estimates[n] * self._weight[n] for n in self._names))

  @contextlib.contextmanager
  def attack(self, name: str) -> Iterator[None]:
    """Counts the calls of attack ``name`` run inside the block."""
    weight = self._weight.get(name, 1)
    if not self._counting.per_call:
      yield
      self._counting.seen(name, 1)
      self._display.finished(name, weight)
      self._display.attack_done(weight)
      return
    calls = self._counting.calls
    calls.watch(self._display.listener(name, self._expected.get(name),
                                       self._weight.get(name, 1)))
    try:
      yield
      count = calls.count
      self._counting.seen(name, count)
      self._display.attack_done(count * self._weight.get(name, 1))
    finally:
      calls.watch(None)

  def scores(self, correct: Mapping[str, int], num_examples: int) -> None:
    """Shows each attack's accuracy so far."""
    if num_examples:
      self._display.set_postfix(
          {n: f"{100.0 * correct[n] / num_examples:.1f}"
           for n in self._names})

  def close(self) -> None:
    self._counting.calls.watch(None)
    self._display.close()


class Silent:
  """Stands in for ``Shown`` when no progress is asked: does nothing."""

  def compiling(self, batch_index: int, name: str) -> None:
    del batch_index, name

  def start_batch(self, batch_index: int, signature: Any) -> None:
    del batch_index, signature

  @contextlib.contextmanager
  def attack(self, name: str) -> Iterator[None]:
    del name
    yield

  def scores(self, correct: Mapping[str, int], num_examples: int) -> None:
    del correct, num_examples

  def close(self) -> None:
    pass


SILENT = Silent()
