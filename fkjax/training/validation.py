"""What a run measures on its validation split at the end of every epoch.

Natural accuracy and, with ``config.validation.attack_steps``, accuracy
under PGD of that many steps (:func:`attacks`), with the keys and the
predictions :class:`fkjax.evaluation.Evaluator` would use; the accuracy of
``config.validation.select_by`` selects a run's best checkpoint
(:func:`selection_column`). The test evaluation of a checkpoint is
:mod:`fkjax.evaluation.run`'s.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections

from fkjax import attacks as attacks_lib
from fkjax.evaluation import loop as eval_loop
from fkjax.evaluation import suites as eval_suites


def attacks(config: ml_collections.ConfigDict
            ) -> dict[str, eval_suites.Attack]:
  """Natural accuracy and, if configured, PGD-k accuracy on validation."""
  suite = {"natural": eval_suites.natural}
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


def correct_counts(eval_apply: Any, suite: Mapping[str, eval_suites.Attack],
                   variables: Any, images: jax.Array, labels: jax.Array,
                   key: jax.Array) -> jax.Array:
  """int32 ``[attacks]``: the batch's images each attack of ``suite`` leaves
  classified right. Pure; ``key`` is the batch's (``Evaluator``'s split of
  it: a prediction key, then one per attack)."""
  predict_key, *attack_keys = jax.random.split(key, len(suite) + 1)
  counts = []
  for attack, attack_key in zip(suite.values(), attack_keys):
    x_adv = attack(eval_apply, variables, images, labels, attack_key)
    probs = eval_loop.predict_probs(eval_apply, variables, x_adv,
                                    predict_key)
    counts.append(jnp.sum(jnp.argmax(probs, axis=-1) == labels))
  return jnp.stack(counts)
