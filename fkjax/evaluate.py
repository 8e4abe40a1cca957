"""Accuracy under a list of attacks: the A1..A5 columns of the paper.

``robust_accuracy`` runs every attack on every batch, classifies the result
with the (possibly noisy) model and reports the accuracy over the real,
non-padding examples together with the time each attack took.
``format_table`` prints the paper's row and ``save_json`` stores the result.
"""
from __future__ import annotations

import collections
import functools
import json
import os
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import tqdm

from fkjax import attacks as attacks_lib

Attack = Callable[[attacks_lib.ApplyFn, Any, jax.Array, jax.Array, jax.Array],
                  jax.Array]
"""``attack(apply_fn, variables, images, labels, key) -> x_adv``."""

# Short result keys of the paper's columns, in the paper's order, and how the
# table labels them.
PAPER_COLUMNS: dict[str, str] = {
    "natural": "A1 natural",
    "fgsm": "A2 FGSM",
    "ifgsm20": "A3 IFGSM20",
    "cw": "A4 C&W",
    "nattack": "A5 NAttack",
}


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
                    unroll: bool | int = True) -> dict[str, Attack]:
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
          eot_samples=eot_samples, unroll=unroll),
      "cw": functools.partial(
          attacks_lib.cw_linf, epsilon=epsilon, step_size=step_size,
          num_steps=cw_steps, random_start=cw_random_start,
          eot_samples=eot_samples,
          unroll=unroll),
      "nattack": functools.partial(
          attacks_lib.nattack, epsilon=epsilon, population=nattack_population,
          max_iters=nattack_iters, chunk=nattack_chunk,
          image_chunk=nattack_image_chunk),
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


def _count_correct(apply_fn, num_noise_draws, variables, images, labels, mask,
                   predict_key):
  probs = predict_probs(apply_fn, variables, images, predict_key,
                        num_noise_draws)
  correct = jnp.logical_and(jnp.argmax(probs, axis=-1) == labels, mask)
  return jnp.sum(correct.astype(jnp.int32))


def _signature(*arrays) -> tuple[Any, ...]:
  return tuple((a.shape, str(a.dtype)) for a in arrays)


class Evaluator:
  """Robust accuracy under fixed attacks, for any variables and data.

  Keeps its compiled functions (one per attack and batch shape, plus the
  shared prediction) across calls, so a training loop that validates every
  epoch compiles once.
  """

  def __init__(self, apply_fn: attacks_lib.ApplyFn,
               attacks: Mapping[str, Attack], *, num_noise_draws: int = 1):
    self.names = list(attacks)
    self.num_noise_draws = num_noise_draws
    self._jitted = {name: jax.jit(functools.partial(attacks[name], apply_fn))
                    for name in self.names}
    self._count_correct = jax.jit(functools.partial(
        _count_correct, apply_fn, num_noise_draws))
    self._compiled: dict[str, dict[Any, Any]] = {n: {} for n in self.names}
    self._compiled_count: dict[Any, Any] = {}

  def __call__(self, variables: Any, batches: Iterable[Mapping[str, Any]],
               key: jax.Array, *, progress: bool = False) -> dict[str, Any]:
    """See :func:`robust_accuracy`; ``compile_seconds`` counts this call's."""
    names = self.names
    compiled, compiled_count = self._compiled, self._compiled_count
    predict_compile_seconds = 0.0
    correct = collections.Counter()
    seconds = collections.Counter()
    compile_seconds = collections.Counter()
    num_examples = 0

    bar = tqdm.tqdm(batches, desc="robust accuracy", unit="batch",
                    disable=not progress)
    for batch_index, batch in enumerate(bar):
      images = jnp.asarray(batch["image"])
      labels = jnp.asarray(batch["label"], jnp.int32)
      if "mask" in batch:
        mask = jnp.asarray(batch["mask"], jnp.bool_)
      else:
        mask = jnp.ones(labels.shape, jnp.bool_)
      # a device-side sum also works for arrays spread over several hosts
      num_examples += int(jnp.sum(mask))
      batch_key = jax.random.fold_in(key, batch_index)
      predict_key, *attack_keys = jax.random.split(batch_key, len(names) + 1)
      signature = _signature(images, labels, mask)
      if signature not in compiled_count:
        start = time.perf_counter()
        compiled_count[signature] = self._count_correct.lower(
            variables, images, labels, mask, predict_key).compile()
        predict_compile_seconds += time.perf_counter() - start
      predict = compiled_count[signature]
      for name, attack_key in zip(names, attack_keys):
        start = time.perf_counter()
        attack = compiled[name].get(signature)
        if attack is None:
          attack = self._jitted[name].lower(variables, images, labels,
                                            attack_key).compile()
          compiled[name][signature] = attack
          compile_seconds[name] += time.perf_counter() - start
        x_adv = attack(variables, images, labels, attack_key)
        correct[name] += int(predict(variables, x_adv, labels, mask,
                                     predict_key))
        seconds[name] += time.perf_counter() - start
      if progress and num_examples:
        bar.set_postfix({name: f"{100.0 * correct[name] / num_examples:.1f}"
                         for name in names})

    return {
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
    }


def robust_accuracy(apply_fn: attacks_lib.ApplyFn,
                    variables: Any,
                    batches: Iterable[Mapping[str, Any]],
                    attacks: Mapping[str, Attack],
                    key: jax.Array,
                    *,
                    num_noise_draws: int = 1,
                    progress: bool = True) -> dict[str, Any]:
  """Accuracy (%) of the model under each attack, over a dataset.

  Each attack is compiled once per batch shape, ahead of time so that compile
  time is reported apart from run time; the prediction is one more compiled
  function that all attacks share. The data are read once: every batch goes
  through all attacks before the next one.
  For a batch, all attacks share the noise key of the final prediction, so
  their accuracies differ by the attacks, not by the prediction noise.

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
    progress: show a tqdm progress bar over batches.

  Returns:
    ``{"num_examples": int, "num_noise_draws": int, "attacks": {name:
    {"accuracy": % correct, "correct": int, "seconds": wall time of the
    attack and the prediction including compilation, "compile_seconds":
    float, "num_compiles": int}}, "predict_compile_seconds": float}``,
    attacks in the order given.
  """
  evaluator = Evaluator(apply_fn, attacks, num_noise_draws=num_noise_draws)
  return evaluator(variables, batches, key, progress=progress)


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
    header.append(PAPER_COLUMNS.get(name, name))
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


def save_json(results: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
  """Writes ``results`` (and anything JSON-serialisable added) to ``path``."""
  directory = os.path.dirname(os.fspath(path))
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(path, "w") as f:
    json.dump(results, f, indent=2)
    f.write("\n")
