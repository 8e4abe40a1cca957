"""What a run measures on its validation split at the end of every epoch.

Natural accuracy and, with ``config.validation.attack_steps``, accuracy
under PGD of that many steps (:func:`attacks`), with the keys and the
predictions :class:`fkjax.evaluation.Evaluator` would use (the same
numbers); the accuracy of ``config.validation.select_by`` selects a run's
best checkpoint (:func:`selection_column`). The test evaluation of a
checkpoint is :mod:`fkjax.evaluation.run`'s.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections

from fkjax import attacks as attacks_lib

# attack(apply_fn, variables, images, labels, key) -> images attacked
Attack = Callable[..., jax.Array]


def natural(apply_fn: Any, variables: Any, images: jax.Array,
            labels: jax.Array, key: jax.Array) -> jax.Array:
  """The identity "attack": accuracy on clean images."""
  del apply_fn, variables, labels, key
  return images


def attacks(config: ml_collections.ConfigDict) -> dict[str, Attack]:
  """Natural accuracy and, if configured, PGD-k accuracy on validation."""
  suite = {"natural": natural}
  steps = config.validation.attack_steps
  if steps:
    suite[f"pgd{steps}"] = functools.partial(
        attacks_lib.pgd, epsilon=config.attack.epsilon,
        step_size=config.attack.step_size, num_steps=steps,
        random_start=False, unroll=config.attack.unroll)
  return suite


def selection_column(config: ml_collections.ConfigDict) -> str:
  """The validation attack whose accuracy selects the best checkpoint
  (``config.validation.select_by``): ``"natural"`` or ``"pgd<k>"``."""
  if config.validation.select_by == "natural":
    return "natural"
  return f"pgd{config.validation.attack_steps}"


def correct_counts(eval_apply: Any, suite: Mapping[str, Attack],
                   variables: Any, images: jax.Array, labels: jax.Array,
                   key: jax.Array) -> jax.Array:
  """int32 ``[attacks]``: the batch's images each attack of ``suite`` leaves
  classified right. Pure; ``key`` is the batch's, split as ``Evaluator``
  splits it: a prediction key (one noise draw), then one per attack."""
  predict_key, *attack_keys = jax.random.split(key, len(suite) + 1)
  counts = []
  for attack, attack_key in zip(suite.values(), attack_keys):
    x_adv = attack(eval_apply, variables, images, labels, attack_key)
    logits = eval_apply(variables, x_adv, predict_key)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    counts.append(jnp.sum(jnp.argmax(probs, axis=-1) == labels))
  return jnp.stack(counts)
