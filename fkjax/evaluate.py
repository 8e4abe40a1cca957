"""Accuracy under a list of attacks: the paper's A1..A5 and the strong protocol.

``robust_accuracy`` runs every attack on every batch, classifies the result
with the (possibly noisy) model and reports the accuracy over the real,
non-padding examples together with the time each attack took.
``format_table`` prints the paper's row and ``save_json`` stores the result.

The strong protocol (``strong_attacks``, ``strong_evaluation``) runs APGD-CE
and APGD-DLR (and APGD-T when asked), with EOT for a noisy model, counts an
image as robust only if every attack fails on it (``worst_case``), repeats
the evaluation over several seeds (``repeat_evaluation``) and prints the
sanity checks of ``fkjax.sanity`` with it.

Progress (``progress=True``) moves with every model call an attack makes,
not once per batch: the attacks then see the model through
``counting_apply``, whose ``jax.debug.callback`` ticks a host-side counter
on each call, and ``fkjax.metric_logging.progress`` shows ``batch 2/8,
ifgsm20 call 13/21: 55/168 model calls``. A call evaluated with ``vmap``
(the EOT draws of one gradient, a NAttack population chunk) counts once.
The expected counts come from the attack's traced program
(``count_model_calls``). Given each attack's work per image
(``Evaluator(work_per_image=...)``, eval.py's forward passes), the display
moves by work units instead, each call weighing its attack's work over its
calls, so that its time-left estimate weighs expensive calls as such. With ``progress=False`` the attacks are compiled
without the callback: the same program, numbers and speed as before.
"""
from __future__ import annotations

import collections
import functools
import json
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.extend import core as jax_core
import numpy as np

from fkjax import attacks as attacks_lib
from fkjax import eval_journal
from fkjax import metric_logging
from fkjax import workdir as workdir_lib

Attack = Callable[[attacks_lib.ApplyFn, Any, jax.Array, jax.Array, jax.Array],
                  jax.Array]
"""``attack(apply_fn, variables, images, labels, key) -> x_adv``."""

# Short result keys of the paper's columns, in the paper's order, and how the
# table labels them.
PAPER_COLUMNS: dict[str, str] = {
    "natural": "A1 natural",
    "fgsm": "A2 FGSM",
    "ifgsm20": "A3 IFGSM20",
    "cw": "A4 C&W-linf",
    "nattack": "A5 NAttack",
}
# Labels of the other columns a paper-protocol table may hold.
COLUMN_LABELS: dict[str, str] = {**PAPER_COLUMNS,
                                 "cw_authors": "A4 C&W (authors')"}


def natural(apply_fn: attacks_lib.ApplyFn, variables: Any, images: jax.Array,
            labels: jax.Array, key: jax.Array) -> jax.Array:
  """The identity "attack": accuracy on clean images (A1)."""
  del apply_fn, variables, labels, key
  return images


def default_attacks(eot_samples: int = 1,
                    nattack_iters: int = 500,
                    *,
                    epsilon: float = 8 / 255,
                    step_size: float = 2 / 255,
                    ifgsm_steps: int = 20,
                    cw_steps: int = 20,
                    nattack_population: int = 300,
                    nattack_chunk: int | None = None,
                    nattack_image_chunk: int | None = None,
                    ifgsm_random_start: bool = False,
                    cw_random_start: bool = True,
                    unroll: int = 1,
                    best_so_far: bool = True,
                    check_draws: int = 1,
                    nattack_variant: str = "paper",
                    nattack_success_draws: int = 3) -> dict[str, Attack]:
  """The paper's attacks, keyed in column order (see ``PAPER_COLUMNS``).

  Args:
    eot_samples: noise draws each gradient of FGSM, IFGSM and C&W averages
      over. 1 is the paper's protocol; larger values give the EOT evaluation
      a noisy model needs. NAttack needs no gradient and ignores it.
    nattack_iters: NAttack's iteration limit (500 in the paper).
    epsilon: l_inf radius of every attack.
    step_size: step of IFGSM and C&W.
    ifgsm_steps: IFGSM steps (A3 is IFGSM^20).
    cw_steps: C&W-l_inf steps.
    nattack_population: NAttack's population.
    nattack_chunk: population members NAttack evaluates at once (memory).
    nattack_image_chunk: images NAttack attacks at once (memory: its
      population arrays grow with ``population * images``).
    ifgsm_random_start: start IFGSM from a random point of the ball. False by
      default: the paper's IFGSM^M starts from ``x^(0) = x`` (its appendix);
      only its training PGD starts at random.
    cw_random_start: start C&W from a random point (the paper is silent).
    unroll: loop form of IFGSM and C&W, see ``fkjax.attacks.pgd``.
    best_so_far: IFGSM and C&W count an image as broken if any iterate
      fooled the model (``pgd(return_best=True)``). ``False`` judges only
      the final iterate, as the paper's attack script does (the difference
      was 0.4-0.6 points on a small ResNet8).
    check_draws: with ``best_so_far``, fresh noise draws an iterate must
      fool (``pgd``'s ``check_draws``); 0 reuses the gradient's logits, free
      and exact for a deterministic model.
    nattack_variant: ``"paper"`` or ``"attackbox"`` (``attacks.nattack``).
    nattack_success_draws: noise draws a NAttack candidate must fool before
      its image is frozen (1 for the attackbox code's behaviour).

  Returns:
    ``{"natural", "fgsm", "ifgsm20", "cw", "nattack"}`` mapped to attacks.
  """
  return {
      "natural": natural,
      "fgsm": functools.partial(attacks_lib.fgsm, epsilon=epsilon,
                                eot_samples=eot_samples),
      "ifgsm20": functools.partial(
          attacks_lib.pgd, epsilon=epsilon, step_size=step_size,
          num_steps=ifgsm_steps, random_start=ifgsm_random_start, loss="ce",
          eot_samples=eot_samples, unroll=unroll, return_best=best_so_far,
          check_draws=check_draws),
      "cw": functools.partial(
          attacks_lib.cw_linf, epsilon=epsilon, step_size=step_size,
          num_steps=cw_steps, random_start=cw_random_start,
          eot_samples=eot_samples, unroll=unroll, return_best=best_so_far,
          check_draws=check_draws),
      "nattack": functools.partial(
          attacks_lib.nattack, epsilon=epsilon, population=nattack_population,
          max_iters=nattack_iters, chunk=nattack_chunk,
          image_chunk=nattack_image_chunk, variant=nattack_variant,
          success_draws=nattack_success_draws),
  }


def predict_probs(apply_fn: attacks_lib.ApplyFn,
                  variables: Any,
                  images: jax.Array,
                  key: jax.Array,
                  num_noise_draws: int = 1) -> jax.Array:
  """Class probabilities averaged over ``num_noise_draws`` noise draws.

  Softmax outputs, not logits, are averaged: the prediction is the ensemble's
  mean belief, which one overconfident draw cannot dominate.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    images: float array ``[batch, ...]``.
    key: PRNG key for the model noise; used as is when ``num_noise_draws`` is 1.
    num_noise_draws: number of noise draws (static), evaluated with ``vmap``.

  Returns:
    float32 array ``[batch, classes]``.
  """
  if num_noise_draws < 1:
    raise ValueError(f"num_noise_draws must be >= 1, got {num_noise_draws}.")

  def probs(noise_key):
    logits = apply_fn(variables, images, noise_key)
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

  if num_noise_draws == 1:
    return probs(key)
  keys = jax.random.split(key, num_noise_draws)
  return jnp.mean(jax.vmap(probs)(keys), axis=0)


def _correct(apply_fn, num_noise_draws, variables, images, labels, mask,
             predict_key):
  probs = predict_probs(apply_fn, variables, images, predict_key,
                        num_noise_draws)
  return jnp.logical_and(jnp.argmax(probs, axis=-1) == labels, mask)


def _signature(*arrays) -> tuple[Any, ...]:
  return tuple((a.shape, str(a.dtype)) for a in arrays)


def to_host(x: Any) -> np.ndarray:
  """A (possibly multi-host, sharded) array as one NumPy array on this host."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def real_rows(batch: Mapping[str, Any]) -> dict[str, Any] | None:
  """The batch without its padding rows (``mask`` False); None if empty.

  A padded row must not reach the model: with ``noise_std_over="batch"``
  an EnResNet scales its noise by the standard deviation over the whole
  batch, so zero rows would change the predictions of the real ones. The
  result has no ``mask`` (every row is real) and keeps the rows' order.
  """
  if "mask" not in batch:
    return dict(batch)
  mask = to_host(batch["mask"]).astype(bool)
  if mask.all():
    return {k: v for k, v in batch.items() if k != "mask"}
  rows = np.flatnonzero(mask)
  if rows.size == 0:
    return None
  if rows[-1] == rows.size - 1:  # a prefix: a plain slice, no gather
    take = lambda v: v[:rows.size]
  else:
    take = lambda v: v[rows]
  return {k: take(v) for k, v in batch.items() if k != "mask"}


# --------------------------------------------------------------------------
# Progress: model calls counted as the attacks run.


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


class _Display:
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


class Evaluator:
  """Robust accuracy under fixed attacks, for any variables and data.

  Keeps its compiled functions (one per attack and batch shape, plus the
  shared prediction) across calls, so a training loop that validates every
  epoch compiles once. With ``progress`` the attacks are compiled once more,
  counting their model calls (``counting_apply``).

  Only real rows reach the model: a batch with padding rows (``mask``
  False) is cut to its real rows first (``real_rows``), so the last, padded
  batch of an evaluation is compiled once more at its smaller size.
  """

  def __init__(self, apply_fn: attacks_lib.ApplyFn,
               attacks: Mapping[str, Attack], *, num_noise_draws: int = 1,
               work_per_image: Mapping[str, float] | None = None,
               survivors_only: Sequence[str] = ()):
    """``survivors_only``: attacks that attack only the images every attack
    before them (in the order given) left classified right, gathered into a
    bucket of the next power of two (AutoAttack's active set, in shapes XLA
    compiles once per bucket size); such an attack's accuracy is then the
    accuracy under it and every attack before it.

    ``work_per_image``: each attack's cost per image in any unit (e.g.
    forward passes, ``fkjax.eval_run.attack_costs``). Given, the progress
    moves by work units (one call of an attack weighs its work over its
    calls per batch), so that the time-left estimate does not take a
    cheap attack's calls for an expensive one's; None: by model calls."""
    self.names = list(attacks)
    self.num_noise_draws = num_noise_draws
    self.work_per_image = (dict(work_per_image) if work_per_image is not None
                           else None)
    unknown = set(survivors_only) - set(self.names)
    if unknown:
      raise ValueError(f"survivors_only names unknown attacks {unknown}")
    self.survivors_only = frozenset(survivors_only)
    self.calls = CallCounter()
    counted = counting_apply(apply_fn, self.calls.tick)
    # False: the attacks as given; True: counting their model calls.
    self._jitted = {
        counting: {name: jax.jit(functools.partial(
            attacks[name], counted if counting else apply_fn))
                   for name in self.names}
        for counting in (False, True)}
    self._correct = jax.jit(functools.partial(
        _correct, apply_fn, num_noise_draws))
    self._compiled: dict[bool, dict[str, dict[Any, Any]]] = {
        counting: {n: {} for n in self.names} for counting in (False, True)}
    # Expected model calls per (attack, batch shape), and the last count
    # seen (the estimate of an attack whose count is not known in advance).
    self._expected: dict[str, dict[Any, int | None]] = {
        n: {} for n in self.names}
    self._seen: dict[str, int] = {}
    self._compiled_correct: dict[Any, Any] = {}

  def compiled_attacks(self, name: str, *, progress: bool = False
                       ) -> list[Any]:
    """The compiled programs of attack ``name`` so far, one per batch shape
    (``jax.stages.Compiled``: ``memory_analysis()``, ``cost_analysis()``);
    ``progress`` selects those compiled with the call counter."""
    return list(self._compiled[bool(progress)][name].values())

  def _on_survivors(self, name: str, counting: bool, alive: np.ndarray,
                    variables: Any, images: jax.Array, labels: jax.Array,
                    key: jax.Array) -> tuple[jax.Array, float]:
    """The batch with only its ``alive`` images attacked by ``name`` (the
    others as given), and the seconds spent compiling."""
    rows = np.flatnonzero(alive)
    if rows.size == 0:
      return images, 0.0
    size = min(1 << int(np.ceil(np.log2(rows.size))), int(images.shape[0]))
    # Padding repeats a survivor; its copies' results are dropped.
    take = np.concatenate([rows, np.repeat(rows[:1], size - rows.size)])
    sub_images, sub_labels = images[take], labels[take]
    signature = _signature(sub_images, sub_labels)
    compiled = self._compiled[counting][name]
    spent = 0.0
    if signature not in compiled:
      start = time.perf_counter()
      traced = self._jitted[counting][name].trace(variables, sub_images,
                                                  sub_labels, key)
      if counting:
        self._expected[name][signature] = count_model_calls(traced.jaxpr)
      compiled[signature] = traced.lower().compile()
      spent = time.perf_counter() - start
    x_sub = compiled[signature](variables, sub_images, sub_labels, key)
    return images.at[rows].set(x_sub[:rows.size]), spent

  def _call_weight(self, name: str, calls: int | None) -> int:
    """How far one model call of ``name`` moves the display (an integer,
    so that the display counts whole units)."""
    if self.work_per_image is None:
      return 1
    return max(1, round(self.work_per_image[name] / max(calls or 1, 1)))

  def __call__(self, variables: Any, batches: Iterable[Mapping[str, Any]],
               key: jax.Array, *, progress: bool = False,
               per_image: bool = False, num_batches: int | None = None,
               desc: str = "robust accuracy",
               journal: eval_journal.Journal | None = None
               ) -> dict[str, Any]:
    """See :func:`robust_accuracy`; ``compile_seconds`` counts this call's.

    ``num_batches`` (default ``len(batches)`` when it has one) gives the
    progress display its total; ``desc`` starts its line. With ``journal``
    the counts are written after every batch, and the batches an earlier
    attempt of the same evaluation finished are taken from it instead of
    attacked again (:mod:`fkjax.eval_journal`; the result is the same, its
    seconds and compile seconds those of all attempts, ``num_compiles`` this
    one's, ``"resumed_seconds"`` the part of the seconds earlier attempts
    spent).
    """
    names = self.names
    counting = bool(progress)
    jitted, compiled = self._jitted[counting], self._compiled[counting]
    compiled_correct = self._compiled_correct
    predict_compile_seconds = 0.0
    correct = collections.Counter()
    seconds = collections.Counter()
    compile_seconds = collections.Counter()
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in names}
    num_examples = 0
    if num_batches is None and hasattr(batches, "__len__"):
      num_batches = len(batches)
    own = {"attacks": names, "num_noise_draws": self.num_noise_draws,
           "per_image": per_image,
           "survivors_only": sorted(self.survivors_only),
           "key": np.asarray(jax.random.key_data(key)).tolist()}
    earlier = journal.load(own) if journal is not None else None
    skip = 0
    if earlier is not None:
      skip = earlier["batches_done"]
      num_examples = earlier["num_examples"]
      correct.update(earlier["correct"])
      seconds.update(earlier["seconds"])
      compile_seconds.update(earlier["compile_seconds"])
      predict_compile_seconds = earlier["predict_compile_seconds"]
      for name, right in earlier["per_image"].items():
        vectors[name].append(right)
    # Attacks an earlier attempt finished on the batch it was killed in.
    kept = earlier.get("partial") if earlier is not None else None
    resumed_seconds = sum(seconds.values()) + sum(
        s for _, s in (kept or {}).get("attacks", {}).values())

    def save(batches_done, partial=None):
      journal.save(
          own, batches_done=batches_done, num_examples=num_examples,
          correct=correct, seconds=seconds, compile_seconds=compile_seconds,
          predict_compile_seconds=predict_compile_seconds,
          per_image=({name: np.concatenate(vectors[name] or [
              np.zeros((0,), bool)]) for name in names}
                     if per_image else None),
          partial=partial)
    # Only process 0 runs the callbacks (jit places them on device 0).
    display = _Display(desc, num_batches,
                       enabled=counting and jax.process_index() == 0,
                       unit=("model call" if self.work_per_image is None
                             else "work unit"))

    try:
      for batch_index, batch in enumerate(batches):
        if batch_index < skip:
          continue
        batch = real_rows(batch)
        if batch is None:
          continue
        images = jnp.asarray(batch["image"])
        labels = jnp.asarray(batch["label"], jnp.int32)
        mask = jnp.ones(labels.shape, jnp.bool_)
        batch_key = jax.random.fold_in(key, batch_index)
        predict_key, *attack_keys = jax.random.split(batch_key,
                                                     len(names) + 1)
        signature = _signature(images, labels, mask)
        if signature not in compiled_correct:
          start = time.perf_counter()
          compiled_correct[signature] = self._correct.lower(
              variables, images, labels, mask, predict_key).compile()
          predict_compile_seconds += time.perf_counter() - start
        predict = compiled_correct[signature]
        # Every attack is compiled before the first runs, so that the
        # display knows the batch's calls from the start.
        for name, attack_key in zip(names, attack_keys):
          if (signature not in compiled[name]
              and name not in self.survivors_only):
            start = time.perf_counter()
            display.compiling(batch_index, name)
            traced = jitted[name].trace(variables, images, labels, attack_key)
            if counting:
              self._expected[name][signature] = count_model_calls(
                  traced.jaxpr)
            compiled[name][signature] = traced.lower().compile()
            elapsed = time.perf_counter() - start
            compile_seconds[name] += elapsed
            seconds[name] += elapsed
        expected, weight = {}, {}
        if counting:
          expected = {name: self._expected[name].get(signature)
                      for name in names}
          estimates = {name: expected[name] if expected[name] is not None
                       else self._seen.get(name) for name in names}
          weight = {name: self._call_weight(name, estimates[name])
                    for name in names}
          display.start_batch(
              batch_index, None if None in estimates.values()
              else sum(estimates[n] * weight[n] for n in names))
        # This batch's (right, seconds) per attack; the journal keeps each
        # finished attack, so a kill loses at most the attack running.
        done = (dict(kept["attacks"]) if kept is not None
                and kept["batch_index"] == batch_index else {})
        for name, attack_key in zip(names, attack_keys):
          if name in done:
            continue
          start = time.perf_counter()
          if counting:
            self.calls.watch(display.listener(name, expected[name],
                                              weight[name]))
          alive = None
          if name in self.survivors_only:
            # done holds every attack before this one (they ran in order).
            alive = np.logical_and.reduce(
                [done[n][0] for n in names[:names.index(name)]]
                + [np.ones(labels.shape, bool)])
            x_adv, spent = self._on_survivors(
                name, counting, alive, variables, images, labels, attack_key)
            compile_seconds[name] += spent
          else:
            x_adv = compiled[name][signature](variables, images, labels,
                                              attack_key)
          right = to_host(predict(variables, x_adv, labels, mask,
                                  predict_key)).astype(bool)
          if alive is not None:
            right &= alive
          done[name] = (right, time.perf_counter() - start)
          if counting:
            calls = self.calls.count
            self.calls.watch(None)
            self._seen[name] = calls
            display.attack_done(calls * weight[name])
          if journal is not None and len(done) < len(names):
            save(batch_index, {"batch_index": batch_index, "attacks": done})
        num_examples += int(labels.shape[0])
        for name, (right, spent) in done.items():
          correct[name] += int(right.sum())
          seconds[name] += spent
          if per_image:
            vectors[name].append(right)
        if counting and num_examples:
          display.set_postfix(
              {name: f"{100.0 * correct[name] / num_examples:.1f}"
               for name in names})
        if journal is not None:
          save(batch_index + 1)
    finally:
      if counting:
        self.calls.watch(None)
      display.close()

    results = {
        "num_examples": num_examples,
        "num_noise_draws": self.num_noise_draws,
        "attacks": {
            name: {
                "accuracy": (100.0 * correct[name] / num_examples
                             if num_examples else float("nan")),
                "correct": correct[name],
                "seconds": seconds[name],
                "compile_seconds": compile_seconds[name],
                "num_compiles": len(compiled[name]),
            } for name in names
        },
        "predict_compile_seconds": predict_compile_seconds,
        "resumed_seconds": resumed_seconds,
    }
    if per_image:
      results["per_image"] = {
          name: (np.concatenate(vectors[name]) if vectors[name]
                 else np.zeros((0,), bool)) for name in names}
    return results


def robust_accuracy(apply_fn: attacks_lib.ApplyFn,
                    variables: Any,
                    batches: Iterable[Mapping[str, Any]],
                    attacks: Mapping[str, Attack],
                    key: jax.Array,
                    *,
                    num_noise_draws: int = 1,
                    progress: bool = True,
                    per_image: bool = False,
                    num_batches: int | None = None,
                    journal: eval_journal.Journal | None = None,
                    work_per_image: Mapping[str, float] | None = None
                    ) -> dict[str, Any]:
  """Accuracy (%) of the model under each attack, over a dataset.

  Each attack is compiled once per batch shape, ahead of time so that compile
  time is reported apart from run time; the prediction is one more compiled
  function that all attacks share. The data are read once: every batch goes
  through all attacks before the next one.
  For a batch, all attacks share the noise key of the final prediction, so
  their accuracies differ by the attacks, not by the prediction noise.
  Padding rows never reach the model (see ``Evaluator``).

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    batches: iterable of dicts with ``"image"`` (float ``[b, ...]`` in
      [0, 1]), ``"label"`` (int ``[b]``) and optionally ``"mask"`` (bool
      ``[b]``, False for padding rows; all True when absent).
    attacks: name -> ``attack(apply_fn, variables, images, labels, key)``,
      e.g. ``default_attacks()``.
    key: PRNG key for the attacks and the model noise.
    num_noise_draws: noise draws the final prediction averages its softmax
      over (stochastic models; 1 for the paper's protocol).
    progress: show progress in model calls (see the module docstring):
      a tqdm bar on a terminal, a plain line every 30 s otherwise.
    per_image: also return, per attack, whether each real image (in data
      order) was classified right after the attack.
    num_batches: the number of batches, for the progress total (default
      ``len(batches)`` if it has one).
    journal: where the counts are written after every batch; the batches an
      earlier attempt of the same evaluation finished are read from it, not
      attacked again (:mod:`fkjax.eval_journal`).
    work_per_image: each attack's cost per image, for the progress (see
      ``Evaluator``); None: progress in model calls.

  Returns:
    ``{"num_examples": int, "num_noise_draws": int (noise draws the
    prediction that scores an adversarial image averages over), "attacks":
    {name: {"accuracy": % correct, "correct": int, "seconds": wall time of
    the attack and the prediction including compilation, "compile_seconds":
    float, "num_compiles": int}}, "predict_compile_seconds": float,
    "resumed_seconds": float (of the seconds, those of batches an earlier
    attempt finished; 0 without a journal)}``, attacks in the order given;
    with ``per_image``, also ``"per_image": {name: bool ndarray
    [num_examples]}``.
  """
  evaluator = Evaluator(apply_fn, attacks, num_noise_draws=num_noise_draws,
                        work_per_image=work_per_image)
  return evaluator(variables, batches, key, progress=progress,
                   per_image=per_image, num_batches=num_batches,
                   journal=journal)


def format_table(results: Mapping[str, Any],
                 sparsity: float | None = None,
                 channel_sparsity: float | None = None) -> str:
  """A Markdown row like the paper's tables: A1..A5, sparsity, channel sparsity.

  Args:
    results: the output of ``robust_accuracy``.
    sparsity: percentage of zero weights, shown when given.
    channel_sparsity: percentage of channels with l2 norm < 1e-15, shown when
      given.

  Returns:
    A three-line Markdown table (header, rule, values; percentages with two
    decimals, as in the paper).
  """
  header, values = [], []
  for name, entry in results["attacks"].items():
    header.append(COLUMN_LABELS.get(name, name))
    values.append(f"{entry['accuracy']:.2f}")
  if sparsity is not None:
    header.append("Sparsity")
    values.append(f"{sparsity:.2f}")
  if channel_sparsity is not None:
    header.append("Ch. Sp.")
    values.append(f"{channel_sparsity:.2f}")
  widths = [max(len(h), len(v)) for h, v in zip(header, values)]

  def row(cells):
    return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"

  rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  return "\n".join([row(header), rule, row(values)])


def _jsonable(value: Any) -> Any:
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_json(results: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
  """Writes ``results`` (and anything JSON-serialisable added) to ``path``.

  NumPy arrays and scalars (e.g. the ``per_image`` vectors) become lists and
  numbers.
  """
  directory = os.path.dirname(os.fspath(path))
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(path, "w") as f:
    json.dump(results, f, indent=2, default=_jsonable)
    f.write("\n")


# --------------------------------------------------------------------------
# The strong protocol.

STRONG_COLUMNS: dict[str, str] = {
    "natural": "natural",
    "apgd_ce": "APGD-CE",
    "apgd_dlr": "APGD-DLR",
    "apgd_t": "APGD-T",
    "worst_case": "worst case",
}

# AutoAttack's "rand" version for randomised defences averages every gradient
# over 20 noise draws.
STOCHASTIC_EOT_SAMPLES = 20
# Fresh noise draws an APGD iterate of a noisy model must fool to count.
STOCHASTIC_CHECK_DRAWS = 3


def worst_case(results: Mapping[str, Any],
               names: Sequence[str] | None = None) -> dict[str, Any]:
  """Per-image worst case: an image is robust only if EVERY attack fails.

  Args:
    results: the output of ``robust_accuracy(..., per_image=True)``.
    names: the attacks to combine (default: all of them, ``natural``
      included, so an image misclassified when clean is never robust).

  Returns:
    ``{"accuracy": %, "correct": int, "num_examples": int, "attacks":
    [names]}``; each image counts once however many attacks break it.
  """
  per_image = results["per_image"]
  names = list(names) if names is not None else list(results["attacks"])
  if not names:
    raise ValueError("worst_case needs at least one attack")
  robust = np.logical_and.reduce([np.asarray(per_image[n], bool)
                                  for n in names])
  n = int(robust.shape[0])
  return {"accuracy": 100.0 * float(robust.mean()) if n else float("nan"),
          "correct": int(robust.sum()), "num_examples": n,
          "attacks": names}


def strong_settings(*, stochastic: bool, eot_samples: int | None = None,
                    check_draws: int | None = None) -> tuple[int, int]:
  """``(eot_samples, check_draws)`` with the strong protocol's defaults.

  A noisy model gets 20 EOT samples (AutoAttack's "rand" version) and 3
  fresh draws for the success check; a deterministic one 1 and 0 (its
  gradient's logits are exact).
  """
  if eot_samples is None:
    eot_samples = STOCHASTIC_EOT_SAMPLES if stochastic else 1
  if check_draws is None:
    check_draws = STOCHASTIC_CHECK_DRAWS if stochastic else 0
  return eot_samples, check_draws


def strong_attacks(epsilon: float = 8 / 255,
                   *,
                   stochastic: bool = False,
                   eot_samples: int | None = None,
                   check_draws: int | None = None,
                   num_iters: int = 100,
                   n_restarts: int = 1,
                   targeted: bool = True,
                   num_targets: int = 9,
                   include_natural: bool = True) -> dict[str, Attack]:
  """The strong protocol's attacks: APGD-CE, APGD-DLR and APGD-T.

  AutoAttack's standard version has APGD-T: without it, an independent
  cross-check found 4 of 500 images of a ResNet8 robust that AutoAttack
  breaks (21.8% against 21.0%; with it 21.0%, no image discordant). With
  EOT for a noisy model, AutoAttack's "rand" version (APGD-CE + APGD-DLR)
  plus APGD-T. APGD-T costs ``num_targets`` runs, APGD-CE and APGD-DLR one
  each (docs/attacks.md has the measured cost); ``targeted=False`` leaves
  it out.

  Args:
    epsilon: l_inf radius.
    stochastic: whether the model draws noise at test time (an EnResNet with
      ``noise_coef > 0``); sets the defaults of the next two.
    eot_samples: noise draws per gradient (default 20 if ``stochastic``,
      else 1).
    check_draws: fresh draws an iterate must fool to count (default 3 if
      ``stochastic``, else 0 = the gradient pass's logits).
    num_iters: APGD iterations per run (100, as AutoAttack).
    n_restarts: random restarts per attack (per target for APGD-T).
    targeted: include APGD-T (targeted DLR, ``num_targets`` targets; costs
      ``num_targets`` runs; needs >= 4 classes).
    num_targets: APGD-T's targets (9: every other CIFAR-10 class).
    include_natural: add the clean images, so the worst case also counts an
      image misclassified when clean as broken.

  Returns:
    ``{"natural", "apgd_ce", "apgd_dlr"[, "apgd_t"]}`` mapped to attacks.
  """
  eot_samples, check_draws = strong_settings(
      stochastic=stochastic, eot_samples=eot_samples, check_draws=check_draws)
  common = dict(epsilon=epsilon, num_iters=num_iters, n_restarts=n_restarts,
                eot_samples=eot_samples, check_draws=check_draws)
  suite: dict[str, Attack] = {}
  if include_natural:
    suite["natural"] = natural
  suite["apgd_ce"] = functools.partial(attacks_lib.apgd, loss="ce", **common)
  suite["apgd_dlr"] = functools.partial(attacks_lib.apgd, loss="dlr",
                                        **common)
  if targeted:
    suite["apgd_t"] = functools.partial(
        attacks_lib.apgd, loss="dlr_targeted", num_targets=num_targets,
        **common)
  return suite


def _batch_source(batches: Callable[[], Iterable[Mapping[str, Any]]]
                  | Sequence[Mapping[str, Any]]
                  ) -> Callable[[], Iterable[Mapping[str, Any]]]:
  if callable(batches):
    return batches
  if isinstance(batches, Sequence):
    return lambda: batches
  raise TypeError("batches must be a sequence of batches or a function "
                  "returning a fresh iterable (an iterator can be read once)")


def _spread(values: Sequence[float]) -> dict[str, Any]:
  values = [float(v) for v in values]
  std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
  return {"mean": float(np.mean(values)), "std": std, "per_seed": values}


def repeat_evaluation(evaluator: Evaluator,
                      variables: Any,
                      batches: Callable[[], Iterable[Mapping[str, Any]]]
                      | Sequence[Mapping[str, Any]],
                      key: jax.Array,
                      *,
                      num_seeds: int = 3,
                      worst_case_of: Sequence[str] | None = None,
                      progress: bool = False,
                      num_batches: int | None = None,
                      journal: eval_journal.Journal | None = None
                      ) -> dict[str, Any]:
  """Runs an evaluation with ``num_seeds`` keys: mean and spread per attack.

  A noisy model's robust accuracy is itself random (the attacks' and the
  prediction's noise draws), so a single number hides its spread. Seed
  ``s`` uses ``jax.random.fold_in(key, s)``; the compiled attacks are
  shared by all seeds.

  Args:
    evaluator: an ``Evaluator`` with the attacks.
    variables: the model variables.
    batches: a sequence of batches, or a function returning a fresh iterable
      of them (read once per seed).
    key: PRNG key.
    num_seeds: evaluations to run (>= 1).
    worst_case_of: attacks the per-image worst case combines (default: all
      of the evaluator's); an empty sequence skips it.
    progress: progress in model calls, one display per seed.
    num_batches: batches per seed, for the progress total.
    journal: where each seed's finished batches are kept
      (``journal.scoped("seed<s>")``), so that a killed evaluation resumes.

  Returns:
    ``{"num_seeds", "num_examples", "num_noise_draws", "attacks": {name:
    {"accuracy": mean %, "std": sample std over seeds (0 for one seed),
    "per_seed": [%], "correct": int (seed 0), "seconds", "compile_seconds":
    summed over seeds, "num_compiles"}}, "worst_case":
    ``worst_case_over_seeds``'s dict (robust = under every attack and every
    seed; the per-seed worst cases beside it),
    "per_image": {name: bool ndarray} of seed 0,
    "predict_compile_seconds", "resumed_seconds"}`` (both summed over
    seeds).
  """
  if num_seeds < 1:
    raise ValueError(f"num_seeds must be >= 1, got {num_seeds}.")
  source = _batch_source(batches)
  names = evaluator.names
  combine = list(names) if worst_case_of is None else list(worst_case_of)
  runs, worst = [], []
  for seed in range(num_seeds):
    run = evaluator(variables, source(), jax.random.fold_in(key, seed),
                    progress=progress, per_image=True,
                    num_batches=num_batches,
                    desc=f"seed {seed + 1}/{num_seeds}",
                    journal=(journal.scoped(f"seed{seed}")
                             if journal is not None else None))
    runs.append(run)
    if combine:
      worst.append(worst_case(run, combine))
  first = runs[0]
  attacks_out = {}
  for name in names:
    entries = [r["attacks"][name] for r in runs]
    spread = _spread([e["accuracy"] for e in entries])
    attacks_out[name] = {
        "accuracy": spread["mean"], "std": spread["std"],
        "per_seed": spread["per_seed"], "correct": entries[0]["correct"],
        "seconds": sum(e["seconds"] for e in entries),
        "compile_seconds": sum(e["compile_seconds"] for e in entries),
        "num_compiles": entries[-1]["num_compiles"],
    }
  results = {
      "num_seeds": num_seeds,
      "num_examples": first["num_examples"],
      "num_noise_draws": first["num_noise_draws"],
      "attacks": attacks_out,
      "per_image": first["per_image"],
      "predict_compile_seconds": sum(r["predict_compile_seconds"]
                                     for r in runs),
      "resumed_seconds": sum(r["resumed_seconds"] for r in runs),
  }
  if combine:
    results["worst_case"] = worst_case_over_seeds(runs, combine)
  return results


def worst_case_over_seeds(runs: Sequence[Mapping[str, Any]],
                          names: Sequence[str]) -> dict[str, Any]:
  """Per-image worst case over every attack AND every seed.

  An image broken by any attack under any seed is broken: the seeds are
  more tries of the attacker, not samples to average. The per-seed worst
  cases are reported beside it as their spread.

  Args:
    runs: ``robust_accuracy(..., per_image=True)`` results of the same
      images, one per seed.
    names: the attacks to combine (``natural`` included, so that an image
      misclassified when clean is never robust).

  Returns:
    ``{"accuracy": % robust under every attack and seed, "correct",
    "num_examples", "attacks", "num_seeds", "correct_per_image": which
    images are robust (``fkjax.workdir.encode_correct``; read back with
    ``decode_correct(text, num_examples)``),
    "per_seed": [% per seed], "mean_over_seeds", "std": sample std over
    seeds (0 for one)}``.
  """
  per_seed = [worst_case(run, names) for run in runs]
  robust = np.logical_and.reduce([
      np.logical_and.reduce([np.asarray(run["per_image"][n], bool)
                             for n in names]) for run in runs])
  n = int(robust.shape[0])
  spread = _spread([w["accuracy"] for w in per_seed])
  return {"accuracy": 100.0 * float(robust.mean()) if n else float("nan"),
          "correct": int(robust.sum()), "num_examples": n,
          "attacks": list(names), "num_seeds": len(runs),
          "correct_per_image": workdir_lib.encode_correct(robust),
          "per_seed": spread["per_seed"],
          "mean_over_seeds": spread["mean"], "std": spread["std"]}


def strong_evaluation(apply_fn: attacks_lib.ApplyFn,
                      variables: Any,
                      batches: Callable[[], Iterable[Mapping[str, Any]]]
                      | Sequence[Mapping[str, Any]],
                      key: jax.Array,
                      *,
                      epsilon: float = 8 / 255,
                      stochastic: bool = False,
                      eot_samples: int | None = None,
                      check_draws: int | None = None,
                      num_noise_draws: int = 1,
                      num_iters: int = 100,
                      n_restarts: int = 1,
                      targeted: bool = True,
                      num_targets: int = 9,
                      targeted_on_survivors: bool = True,
                      num_seeds: int = 3,
                      sanity_batches: Sequence[Mapping[str, Any]]
                      | None = None,
                      sanity_options: Mapping[str, Any] | None = None,
                      progress: bool = False,
                      num_batches: int | None = None,
                      journal: eval_journal.Journal | None = None
                      ) -> dict[str, Any]:
  """The strong protocol: APGD suite, per-image worst case, seeds, sanity.

  Runs ``strong_attacks`` over the data ``num_seeds`` times
  (``repeat_evaluation``), reports each attack's accuracy and the
  per-image worst case over all of them (clean images included) as mean
  and std over the seeds, and, given ``sanity_batches``, runs
  ``fkjax.sanity.sanity_checks`` on them with the same settings.

  Args:
    apply_fn: ``apply_fn(variables, images, key) -> logits``.
    variables: the model variables.
    batches: a sequence of batches or a function returning a fresh iterable
      (dicts with ``image``, ``label`` and optional ``mask``).
    key: PRNG key.
    epsilon, stochastic, eot_samples, check_draws, num_iters, n_restarts,
      targeted, num_targets: see ``strong_attacks``.
    num_noise_draws: noise draws the prediction that scores an adversarial
      image averages its softmax over (recorded in the result).
    targeted_on_survivors: APGD-T attacks only the images APGD-CE and
      APGD-DLR left robust (AutoAttack's order; ``Evaluator``'s
      ``survivors_only``), so its 9 runs cost what those images need; its
      reported accuracy is then the worst case over the three. False: every
      image, and APGD-T's own accuracy.
    num_seeds: evaluation seeds (3 gives mean +- std; 1 for a quick run).
    sanity_batches: batches for the sanity checks (a few hundred images;
      None skips them).
    sanity_options: extra keyword arguments of ``sanity.sanity_checks``.
    progress: progress in model calls (see ``robust_accuracy``).
    num_batches: batches of ``batches``, for the progress total.
    journal: keeps the finished batches of the seeds
      (``repeat_evaluation``) and of the sanity checks (``scoped("sanity")``).

  Returns:
    ``repeat_evaluation``'s dict plus ``"protocol": "strong"``,
    ``"description"`` (one line), ``"settings"`` (every option above, the
    resolved ``eot_samples`` and ``check_draws`` included), ``"seconds"``
    (wall time of the whole evaluation, of every attempt when resumed from
    ``journal``, sanity checks excluded) and, with
    ``sanity_batches``, ``"sanity"`` (``SanityReport.to_dict()``: ``passed``,
    ``checks``, ...) and ``"sanity_text"``.
  """
  from fkjax import sanity  # pylint: disable=import-outside-toplevel

  eot_samples, check_draws = strong_settings(
      stochastic=stochastic, eot_samples=eot_samples, check_draws=check_draws)
  suite = strong_attacks(
      epsilon, stochastic=stochastic, eot_samples=eot_samples,
      check_draws=check_draws, num_iters=num_iters, n_restarts=n_restarts,
      targeted=targeted, num_targets=num_targets)
  settings = {
      "epsilon": epsilon, "stochastic": stochastic,
      "eot_samples": eot_samples, "check_draws": check_draws,
      "num_noise_draws": num_noise_draws, "num_iters": num_iters,
      "n_restarts": n_restarts, "targeted": targeted,
      "num_targets": num_targets if targeted else 0, "num_seeds": num_seeds,
      "targeted_on_survivors": bool(targeted and targeted_on_survivors),
  }
  start = time.perf_counter()
  evaluator = Evaluator(
      apply_fn, suite, num_noise_draws=num_noise_draws,
      survivors_only=(["apgd_t"] if targeted and targeted_on_survivors
                      else []))
  results = repeat_evaluation(evaluator, variables, batches, key,
                              num_seeds=num_seeds, progress=progress,
                              num_batches=num_batches, journal=journal)
  # A resumed evaluation's seconds include what its earlier attempts spent.
  seconds = time.perf_counter() - start + results["resumed_seconds"]
  labels = [STRONG_COLUMNS[n] for n in suite if n != "natural"]
  description = (
      f"strong protocol: {' + '.join(labels)}, {num_iters} iterations, "
      f"{n_restarts} restart(s), l_inf eps={epsilon * 255:g}/255, "
      f"EOT {eot_samples} sample(s) per gradient, success checked on "
      f"{check_draws or 'the gradient pass'} fresh draw(s), adversarial "
      f"images scored on {num_noise_draws} noise draw(s); "
      + ("APGD-T attacks only the images APGD-CE and APGD-DLR left robust; "
         if settings["targeted_on_survivors"] else "")
      + f"each attack: "
      f"mean +- std over {num_seeds} seed(s); worst case: robust = every "
      f"attack fails on the image under every seed")
  results = {"protocol": "strong", "description": description,
             "settings": settings, **results, "seconds": seconds}
  if sanity_batches is not None:
    options = dict(epsilon=epsilon, stochastic=stochastic,
                   eot_samples=eot_samples, check_draws=check_draws,
                   num_noise_draws=num_noise_draws,
                   apgd_budget=(num_iters, n_restarts))
    options.update(sanity_options or {})
    report = sanity.sanity_checks(
        apply_fn, variables, sanity_batches,
        jax.random.fold_in(key, 1_000_003), progress=progress,
        journal=journal.scoped("sanity") if journal is not None else None,
        **options)
    results["sanity"] = report.to_dict()
    results["sanity_text"] = report.format()
  return results


def format_strong(results: Mapping[str, Any]) -> str:
  """Text of a ``strong_evaluation`` result: one line per attack, the worst
  case, the settings and the sanity report (if it ran)."""
  lines = [results.get("description", "strong protocol"),
           f"{results['num_examples']} images; accuracy % (mean +- std over "
           f"{results['num_seeds']} seed(s)); seconds (all seeds)"]
  width = max(len(STRONG_COLUMNS.get(n, n)) for n in
              list(results["attacks"]) + ["worst_case"])
  for name, entry in results["attacks"].items():
    label = STRONG_COLUMNS.get(name, name)
    lines.append(f"  {label:<{width}}  {entry['accuracy']:6.2f} +- "
                 f"{entry['std']:5.2f}  {entry['seconds']:8.1f} s")
  if "worst_case" in results:
    w = results["worst_case"]
    label = STRONG_COLUMNS["worst_case"]
    lines.append(
        f"  {label:<{width}}  {w['accuracy']:6.2f} (every attack, every "
        f"seed: {w['correct']}/{w['num_examples']} images); per seed "
        f"{w['mean_over_seeds']:.2f} +- {w['std']:.2f} (min "
        f"{min(w['per_seed']):.2f}, max {max(w['per_seed']):.2f})")
  if "sanity_text" in results:
    lines.append(results["sanity_text"])
  return "\n".join(lines)
