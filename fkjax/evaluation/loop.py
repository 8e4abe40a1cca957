"""The evaluation loop: accuracy under a suite of attacks, batch by batch.

``Evaluator`` runs every attack of a suite on every batch, classifies the
result with the (possibly noisy) model (``predict_probs``) and counts, per
attack, the real (non-padding) images it left classified right, with the
seconds each attack took; ``robust_accuracy`` is one evaluation with a
fresh ``Evaluator``. Its counts accumulate in a ``Tally``, which a
``fkjax.evaluation.journal.Journal`` keeps after every batch and attack so that a
killed evaluation resumes, and which gives the result (an
``fkjax.evaluation.result.EvalResult``). Progress in model calls is the optional
layer of ``fkjax.evaluation.progress``.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Iterable, Mapping, Sequence

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np

from fkjax import attacks as attacks_lib
from fkjax.evaluation import journal as eval_journal
from fkjax.evaluation import memory as eval_memory
from fkjax.evaluation import progress as eval_progress
from fkjax.evaluation import result as eval_result
from fkjax.evaluation.suites import Attack


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


def _signature(*arrays: Any, layout: Any = None) -> tuple[Any, ...]:
  return tuple((a.shape, str(a.dtype)) for a in arrays) + (layout,)


def batch_layout(batch: Mapping[str, Any]) -> NamedSharding | None:
  """How ``batch``'s rows are split over devices: a sharding of its first
  axis over a mesh, or None (one device, or every device the whole batch).
  """
  sharding = getattr(batch.get("image"), "sharding", None)
  if (not isinstance(sharding, NamedSharding) or not sharding.spec
      or sharding.spec[0] is None):
    return None
  return NamedSharding(sharding.mesh, P(sharding.spec[0]))


def _on_layout(fn: Any, layout: NamedSharding | None, variables: Any,
               images: jax.Array, labels: jax.Array, *rest: Any) -> Any:
  """``fn(variables, images, labels, *rest)`` with the rows split over
  ``layout``'s devices inside the program, whatever their number: XLA pads
  the last device's part and leaves the padding out of every reduction (a
  batch's standard deviation, its BatchNorm statistics), so the numbers are
  those of the rows alone, where a placed array must divide evenly."""
  if layout is not None:
    images, labels = jax.lax.with_sharding_constraint((images, labels),
                                                      layout)
  return fn(variables, images, labels, *rest)


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
  result has no ``mask`` (every row is real) and keeps the rows' order; its
  rows need not divide over the devices the batch was split over
  (``batch_layout``: the ``Evaluator`` splits them inside its programs).
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


def _counter() -> collections.Counter:
  return collections.Counter()


@dataclasses.dataclass
class Tally:
  """What an evaluation has counted so far: its result in the making.

  ``correct``, ``seconds`` and ``compile_seconds`` are per attack; a
  batch's ``seconds`` include its attack's compilation. ``resumed_seconds``
  is the part of ``seconds`` that earlier attempts (a journal) spent.
  """
  names: list[str]
  per_image: bool
  num_examples: int = 0
  correct: collections.Counter = dataclasses.field(default_factory=_counter)
  seconds: collections.Counter = dataclasses.field(default_factory=_counter)
  compile_seconds: collections.Counter = dataclasses.field(
      default_factory=_counter)
  predict_compile_seconds: float = 0.0
  resumed_seconds: float = 0.0
  vectors: dict[str, list[np.ndarray]] = dataclasses.field(
      default_factory=dict)

  @classmethod
  def resume(cls, names: Sequence[str], per_image: bool,
             earlier: Mapping[str, Any] | None) -> "Tally":
    """A tally starting from ``earlier`` (``Journal.load``'s state; None:
    from nothing)."""
    tally = cls(list(names), per_image,
                vectors={name: [] for name in names})
    if earlier is None:
      return tally
    tally.num_examples = earlier["num_examples"]
    tally.correct.update(earlier["correct"])
    tally.seconds.update(earlier["seconds"])
    tally.compile_seconds.update(earlier["compile_seconds"])
    tally.predict_compile_seconds = earlier["predict_compile_seconds"]
    for name, right in earlier["per_image"].items():
      tally.vectors[name].append(right)
    kept = earlier.get("partial") or {}
    tally.resumed_seconds = sum(tally.seconds.values()) + sum(
        spent for _, spent in kept.get("attacks", {}).values())
    return tally

  def add_batch(self, done: Mapping[str, tuple[np.ndarray, float]]) -> None:
    """Counts a finished batch: per attack, which images it left right and
    its seconds."""
    self.num_examples += len(next(iter(done.values()))[0]) if done else 0
    for name, (right, spent) in done.items():
      self.correct[name] += int(right.sum())
      self.seconds[name] += spent
      if self.per_image:
        self.vectors[name].append(right)

  def per_image_vectors(self) -> dict[str, np.ndarray]:
    """Per attack, whether each image so far was left right."""
    return {name: (np.concatenate(self.vectors[name]) if self.vectors[name]
                   else np.zeros((0,), bool)) for name in self.names}

  def journal_state(self) -> dict[str, Any]:
    """``Journal.save``'s keyword arguments of the counts so far."""
    return dict(num_examples=self.num_examples, correct=self.correct,
                seconds=self.seconds, compile_seconds=self.compile_seconds,
                predict_compile_seconds=self.predict_compile_seconds,
                per_image=(self.per_image_vectors() if self.per_image
                           else None))

  def result(self, num_noise_draws: int,
             num_compiles: Mapping[str, int]) -> eval_result.EvalResult:
    """The evaluation's result so far (``robust_accuracy``'s)."""
    n = self.num_examples
    return eval_result.EvalResult(
        num_examples=n, num_noise_draws=num_noise_draws,
        attacks={name: eval_result.AttackResult(
            accuracy=(100.0 * self.correct[name] / n if n else float("nan")),
            correct=self.correct[name], seconds=self.seconds[name],
            compile_seconds=self.compile_seconds[name],
            num_compiles=num_compiles[name]) for name in self.names},
        predict_compile_seconds=self.predict_compile_seconds,
        resumed_seconds=self.resumed_seconds,
        per_image=self.per_image_vectors() if self.per_image else None)


def _survivors_of(names: Sequence[str],
                  survivors_only: Sequence[str] | Mapping[str, Sequence[str]]
                  ) -> dict[str, tuple[str, ...]]:
  """Per attack on survivors, the attacks whose survivors it attacks."""
  if isinstance(survivors_only, Mapping):
    wanted = {name: tuple(after) for name, after in survivors_only.items()}
  else:
    wanted = {name: tuple(names[:names.index(name)]) if name in names else ()
              for name in survivors_only}
  unknown = set(wanted) - set(names)
  if unknown:
    raise ValueError(f"survivors_only names unknown attacks {unknown}")
  for name, after in wanted.items():
    later = [a for a in after if a not in names[:names.index(name)]]
    if later:
      raise ValueError(f"survivors_only: {name!r} can follow only attacks "
                       f"that run before it, not {later}")
  return wanted


class Evaluator:
  """Robust accuracy under fixed attacks, for any variables and data.

  Keeps its compiled functions (one per attack and batch shape, plus the
  shared prediction) across calls, so a training loop that validates every
  epoch compiles once. With ``progress`` the attacks are compiled once more,
  counting their model calls (``fkjax.evaluation.progress``).

  Only real rows reach the model: a batch with padding rows (``mask``
  False) is cut to its real rows first (``real_rows``), so the last, padded
  batch of an evaluation is compiled once more at its smaller size. A batch
  placed split over devices (``batch_layout``: padded to a multiple of them,
  as ``fkjax.training.parallel.eval_batches`` places it) is computed split
  over them, however many real rows it has.
  """

  def __init__(self, apply_fn: attacks_lib.ApplyFn,
               attacks: Mapping[str, Attack], *, num_noise_draws: int = 1,
               work_per_image: Mapping[str, float] | None = None,
               survivors_only: Sequence[str] | Mapping[str, Sequence[str]]
               = (), batch_key: str = "the batch size"):
    """``survivors_only``: attacks that attack only the images earlier
    attacks left classified right, gathered into a bucket of the next power
    of two (AutoAttack's active set, in shapes XLA compiles once per bucket
    size). A sequence of names: each attacks the survivors of every attack
    before it (in the order given); a mapping: each named attack attacks the
    survivors of the earlier attacks it lists (``{"apgd_ce": ["natural"]}``
    attacks only the images classified right when clean, as torchattacks'
    and AutoAttack's APGD do). Such an attack's accuracy is the accuracy
    under it and the attacks it follows.

    ``work_per_image``: each attack's cost per image, for the progress
    (``eval_progress.CallCounting``); None: progress in model calls.
    ``batch_key``: the setting of the batch size, which a batch too large
    for memory names (:mod:`fkjax.evaluation.memory`)."""
    self.names = list(attacks)
    self.num_noise_draws = num_noise_draws
    self.survivors_of = _survivors_of(self.names, survivors_only)
    self.counting = eval_progress.CallCounting(apply_fn, work_per_image)
    self.calls = self.counting.calls
    # False: the attacks as given; True: counting their model calls.
    self._attacks = {
        counting: {name: functools.partial(
            attacks[name], self.counting.apply_fn if counting else apply_fn)
                   for name in self.names}
        for counting in (False, True)}
    self._correct = functools.partial(_correct, apply_fn, num_noise_draws)
    # (function, layout) -> the function jitted on that layout.
    self._jitted: dict[Any, Any] = {}
    self._compiled: dict[bool, dict[str, dict[Any, Any]]] = {
        counting: {n: {} for n in self.names} for counting in (False, True)}
    self._compiled_correct: dict[Any, Any] = {}
    # The setting a batch too large for memory is refused by.
    self.batch_key = batch_key

  def _jit(self, fn: Any, layout: NamedSharding | None) -> Any:
    """``fn`` jitted with its batch split over ``layout`` (``_on_layout``)."""
    if (id(fn), layout) not in self._jitted:
      self._jitted[id(fn), layout] = jax.jit(
          functools.partial(_on_layout, fn, layout))
    return self._jitted[id(fn), layout]

  def compiled_attacks(self, name: str, *, progress: bool = False
                       ) -> list[Any]:
    """The compiled programs of attack ``name`` so far, one per batch shape
    (``jax.stages.Compiled``: ``memory_analysis()``, ``cost_analysis()``);
    ``progress`` selects those compiled with the call counter."""
    return list(self._compiled[bool(progress)][name].values())

  def _compile(self, name: str, counting: bool, variables: Any,
               images: jax.Array, labels: jax.Array, key: jax.Array,
               layout: NamedSharding | None, announce: Any = None
               ) -> tuple[Any, float]:
    """Attack ``name`` compiled for this batch shape and layout, and the
    seconds that took (0 when it was compiled before); ``announce()``
    before compiling."""
    signature = _signature(images, labels, layout=layout)
    cache = self._compiled[counting][name]
    if signature in cache:
      return cache[signature], 0.0
    if announce is not None:
      announce()
    start = time.perf_counter()
    jitted = self._jit(self._attacks[counting][name], layout)
    traced = jitted.trace(variables, images, labels, key)
    if counting:
      self.counting.traced(name, signature, traced)
    cache[signature] = traced.lower().compile()
    self._check_memory(name, jitted, cache[signature], variables, images,
                       labels, key)
    return cache[signature], time.perf_counter() - start

  def _check_memory(self, name: str, jitted: Any, compiled: Any,
                    variables: Any, images: jax.Array, labels: jax.Array,
                    key: jax.Array) -> None:
    """Refuses, in one line, a batch that would not fit in memory
    (:mod:`fkjax.evaluation.memory`), before it runs."""
    placed = list(getattr(getattr(images, "sharding", None), "device_set",
                          ()) or jax.devices()[:1])
    devices = len(placed)
    eval_memory.check(
        compiled, int(images.shape[0]), f"attack {name}",
        batch_key=self.batch_key,
        at_batch=lambda b: jitted.trace(
            variables, images[:b], labels[:b], key).lower().compile(),
        # The CPU's devices share its memory; a GPU's estimate is its own.
        scale=devices if placed[0].platform == "cpu" else 1,
        free=eval_memory.free_bytes(placed[0]))

  def _predictor(self, tally: Tally, layout: NamedSharding | None,
                 *args: Any) -> Any:
    """The compiled prediction for this batch shape and layout (its
    compilation counted in ``tally``)."""
    signature = _signature(*args[1:4], layout=layout)
    if signature not in self._compiled_correct:
      start = time.perf_counter()
      self._compiled_correct[signature] = self._jit(
          self._correct, layout).lower(*args).compile()
      tally.predict_compile_seconds += time.perf_counter() - start
    return self._compiled_correct[signature]

  def _on_survivors(self, name: str, counting: bool, alive: np.ndarray,
                    variables: Any, images: jax.Array, labels: jax.Array,
                    key: jax.Array, layout: NamedSharding | None
                    ) -> tuple[jax.Array, float]:
    """The batch with only its ``alive`` images attacked by ``name`` (the
    others as given), and the seconds spent compiling."""
    rows = np.flatnonzero(alive)
    if rows.size == 0:
      return images, 0.0
    size = min(1 << int(np.ceil(np.log2(rows.size))), int(images.shape[0]))
    # Padding repeats a survivor; its copies' results are dropped.
    take = np.concatenate([rows, np.repeat(rows[:1], size - rows.size)])
    compiled, spent = self._compile(name, counting, variables, images[take],
                                    labels[take], key, layout)
    x_sub = compiled(variables, images[take], labels[take], key)
    return images.at[rows].set(x_sub[:rows.size]), spent

  def _batch(self, variables: Any, batch: Mapping[str, Any],
             layout: NamedSharding | None, batch_key: jax.Array,
             batch_index: int, counting: bool, tally: Tally, shown: Any,
             done: dict[str, tuple[np.ndarray, float]],
             on_attack: Any) -> dict[str, tuple[np.ndarray, float]]:
    """Runs the attacks not ``done`` yet on one batch of real rows, split
    over ``layout``; returns every attack's (right per image, seconds).
    ``on_attack(done)`` after each attack but the last (the journal keeps
    them)."""
    names = self.names
    images = jnp.asarray(batch["image"])
    labels = jnp.asarray(batch["label"], jnp.int32)
    mask = jnp.ones(labels.shape, jnp.bool_)
    predict_key, *attack_keys = jax.random.split(batch_key, len(names) + 1)
    predict = self._predictor(tally, layout, variables, images, labels, mask,
                              predict_key)
    # Every attack is compiled before the first runs, so that the display
    # knows the batch's calls from the start.
    for name, attack_key in zip(names, attack_keys):
      if name not in self.survivors_of:
        _, spent = self._compile(
            name, counting, variables, images, labels, attack_key, layout,
            functools.partial(shown.compiling, batch_index, name))
        tally.compile_seconds[name] += spent
        tally.seconds[name] += spent
    shown.start_batch(batch_index, _signature(images, labels, layout=layout))
    for name, attack_key in zip(names, attack_keys):
      if name in done:
        continue
      start = time.perf_counter()
      with shown.attack(name):
        if name in self.survivors_of:
          # done holds every attack before this one (they ran in order).
          alive = np.logical_and.reduce(
              [done[n][0] for n in self.survivors_of[name]]
              + [np.ones(labels.shape, bool)])
          x_adv, spent = self._on_survivors(name, counting, alive, variables,
                                            images, labels, attack_key,
                                            layout)
          tally.compile_seconds[name] += spent
        else:
          alive = None
          x_adv = self._compile(name, counting, variables, images, labels,
                                attack_key, layout)[0](variables, images,
                                                       labels, attack_key)
        right = to_host(predict(variables, x_adv, labels, mask,
                                predict_key)).astype(bool)
      if alive is not None:
        right &= alive
      done[name] = (right, time.perf_counter() - start)
      if len(done) < len(names):
        on_attack(done)
    return done

  def _survivors_fingerprint(self) -> Any:
    """What the journal keys on: the names alone where each attack follows
    every attack before it (journals of that form stay valid)."""
    every_before = all(
        list(after) == self.names[:self.names.index(name)]
        for name, after in self.survivors_of.items())
    if every_before:
      return sorted(self.survivors_of)
    return {name: list(after)
            for name, after in sorted(self.survivors_of.items())}

  def __call__(self, variables: Any, batches: Iterable[Mapping[str, Any]],
               key: jax.Array, *, progress: bool = False,
               per_image: bool = False, num_batches: int | None = None,
               desc: str = "robust accuracy",
               journal: eval_journal.Journal | None = None
               ) -> eval_result.EvalResult:
    """See :func:`robust_accuracy`; ``compile_seconds`` counts this call's.

    ``num_batches`` (default ``len(batches)`` when it has one) gives the
    progress display its total; ``desc`` starts its line. With ``journal``
    the counts are written after every batch, and the batches an earlier
    attempt of the same evaluation finished are taken from it instead of
    attacked again (:mod:`fkjax.evaluation.journal`; the result is the same, its
    seconds and compile seconds those of all attempts, ``num_compiles`` this
    one's, ``resumed_seconds`` the part of the seconds earlier attempts
    spent).
    """
    counting = bool(progress)
    if num_batches is None and hasattr(batches, "__len__"):
      num_batches = len(batches)
    own = {"attacks": self.names, "num_noise_draws": self.num_noise_draws,
           "per_image": per_image,
           "survivors_only": self._survivors_fingerprint(),
           "key": np.asarray(jax.random.key_data(key)).tolist()}
    earlier = journal.load(own) if journal is not None else None
    tally = Tally.resume(self.names, per_image, earlier)
    skip = earlier["batches_done"] if earlier is not None else 0
    # Attacks an earlier attempt finished on the batch it was killed in.
    kept = earlier.get("partial") if earlier is not None else None

    def save(batches_done, partial=None):
      if journal is not None:
        journal.save(own, batches_done=batches_done, partial=partial,
                     **tally.journal_state())
    # Only process 0 runs the callbacks (jit places them on device 0).
    shown = (self.counting.show(self.names, desc, num_batches,
                                enabled=jax.process_index() == 0)
             if counting else eval_progress.SILENT)
    try:
      for batch_index, batch in enumerate(batches):
        layout = batch_layout(batch)
        batch = real_rows(batch) if batch_index >= skip else None
        if batch is None:
          continue
        done = (dict(kept["attacks"]) if kept is not None
                and kept["batch_index"] == batch_index else {})
        done = self._batch(
            variables, batch, layout, jax.random.fold_in(key, batch_index),
            batch_index, counting, tally, shown, done,
            lambda d, i=batch_index: save(i, {"batch_index": i,
                                              "attacks": d}))
        tally.add_batch(done)
        shown.scores(tally.correct, tally.num_examples)
        save(batch_index + 1)
    finally:
      shown.close()
    return tally.result(self.num_noise_draws, {
        name: len(self._compiled[counting][name]) for name in self.names})


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
                    work_per_image: Mapping[str, float] | None = None,
                    batch_key: str = "the batch size"
                    ) -> eval_result.EvalResult:
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
      attacked again (:mod:`fkjax.evaluation.journal`).
    work_per_image: each attack's cost per image, for the progress (see
      ``Evaluator``); None: progress in model calls.

  Returns:
    An ``fkjax.evaluation.result.EvalResult``: per attack (in the order given)
    the accuracy (%), the count, the seconds (attack and prediction,
    compilation included), compile seconds and compilations; the
    prediction's compile seconds; ``resumed_seconds`` (of the seconds,
    those of batches an earlier attempt finished; 0 without a journal); with
    ``per_image``, per attack a bool array ``[num_examples]``.
    ``result.to_json()`` is the dict a result file holds.
  """
  evaluator = Evaluator(apply_fn, attacks, num_noise_draws=num_noise_draws,
                        work_per_image=work_per_image, batch_key=batch_key)
  return evaluator(variables, batches, key, progress=progress,
                   per_image=per_image, num_batches=num_batches,
                   journal=journal)
