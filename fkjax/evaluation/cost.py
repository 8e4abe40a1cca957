"""What an evaluation costs, in forward passes per image: the cost model of
the attacks, and the estimate an evaluation says before it starts.

``attack_costs`` reads each attack's cost from the attack ``attack_suite``
builds (its steps, EOT samples and check draws); the progress display counts
its work in these units (``fkjax.evaluation.progress``), and
``cost_summary`` is the line ``eval.py`` prints first.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import ml_collections

from fkjax import attacks
from fkjax.evaluation import suites as eval_suites


# Forward passes one gradient costs (forward + backward), for the cost line.
_GRADIENT_COST = 3


def _iterative_cost(k: Mapping[str, Any]) -> int:
  # A best-so-far iterate is checked on fresh draws (none: the gradient's
  # logits are reused).
  check = k["check_draws"] if k["return_best"] else 0
  return k["num_steps"] * (_GRADIENT_COST * k["eot_samples"] + check) + 1


# Attack function -> forward passes per image, from its keyword arguments.
_COSTS: dict[Callable[..., Any], Callable[[Mapping[str, Any]], int]] = {
    attacks.fgsm: lambda k: _GRADIENT_COST * k["eot_samples"] + 1,
    attacks.pgd: _iterative_cost,
    attacks.cw_linf: _iterative_cost,
    attacks.cw_authors: lambda k: k["num_steps"] * _GRADIENT_COST + 1,
    attacks.nattack: lambda k: k["max_iters"] * (k["population"]
                                                 + k["success_draws"]) + 1,
}


def _attack_cost(attack: eval_suites.Attack) -> int:
  """Forward passes ``attack`` (``natural`` or a ``functools.partial`` of
  an ``fkjax.attacks`` function) costs per image at most."""
  if attack is eval_suites.natural:
    return 1
  func = attack.func
  keywords = {name: p.default
              for name, p in inspect.signature(func).parameters.items()
              if p.default is not inspect.Parameter.empty}
  return _COSTS[func]({**keywords, **attack.keywords})


def attack_costs(names: list[str], config: ml_collections.ConfigDict
                 ) -> dict[str, int]:
  """Forward-pass equivalents each attack of the paper's protocol costs per
  image at most (a gradient counts 3; NAttack stops early once every image
  of its batch is broken, so it can cost less), read from the attacks
  ``attack_suite`` builds (their steps, EOT and check draws)."""
  suite = eval_suites.attack_suite(",".join(names), config)
  return {name: _attack_cost(suite[name]) for name in names}


def cost_summary(names: list[str], config: ml_collections.ConfigDict,
                 num_images: int) -> str:
  """What an evaluation will cost, said before it starts, and how to bound
  it: each attack's share of the forward passes, and the flags that cut
  the bulk."""
  costs = attack_costs(names, config)
  total = sum(costs.values())
  shares = ", ".join(f"{name} {cost} ({100 * cost / total:.0f}%)"
                     for name, cost in costs.items())
  batch = config.eval.batch_size
  text = (f"evaluating {num_images} test images in batches of "
          f"{min(batch, num_images)}; forward passes per image (a gradient "
          f"counts 3), at most: {shares}.")
  heavy = max(costs, key=costs.get)
  if costs[heavy] > total / 2 and len(costs) > 1:
    rest = ",".join(n for n in names if n != heavy)
    text += (f" {heavy} is most of the time: --config.eval.attacks={rest} "
             f"leaves it out")
    if heavy == "nattack":
      text += (", --config.eval.nattack_iters=N shortens it (the paper's "
               "is 500)")
    text += (f"; --config.eval.num_examples=N evaluates the first N images "
             f"only (written to its own file).")
  return text + (" A killed evaluation resumes at its next batch: run the "
                 "same command again.")
