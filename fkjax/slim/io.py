"""Saving and loading slim networks: ``architecture.json`` + orbax variables.

A slim model directory holds::

    architecture.json   # fkjax.slim.spec.dumps: every member's NetSpec
    variables/          # orbax StandardCheckpointer: params and batch_stats

and :func:`load_slim` rebuilds the model from these two alone.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
from jax import lax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from fkjax.slim import spec as spec_lib
from fkjax.slim.core import specs_of
from fkjax.slim.model import SlimEnResNet, SlimResNet

PyTree = Any
ARCHITECTURE = "architecture.json"
VARIABLES = "variables"


def save_slim(path: str, model: SlimResNet | SlimEnResNet,
              variables: PyTree, **extra: Any) -> str:
  """Writes ``model`` and its variables under ``path`` (a new directory).

  ``extra`` (JSON-serialisable) is stored in ``architecture.json``, e.g.
  where the model came from. Returns the absolute path.
  """
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  if isinstance(model, SlimEnResNet):
    extra = {"member_execution": model.member_execution, **extra}
  with open(os.path.join(path, ARCHITECTURE), "w") as f:
    f.write(spec_lib.dumps(specs_of(model), **extra))
  variables = jax.tree.map(jnp.asarray, {
      "params": variables["params"],
      "batch_stats": variables.get("batch_stats", {})})
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(path, VARIABLES), variables, force=True)
    checkpointer.wait_until_finished()
  return path


def load_slim_model(path: str, conv: Callable = lax.conv_general_dilated,
                    inject: Callable | None = None
                    ) -> tuple[SlimResNet | SlimEnResNet, PyTree, dict]:
  """``(model, variables, extra)`` of a directory :func:`save_slim` wrote.

  ``conv`` and ``inject`` choose the implementations (see
  :class:`fkjax.slim.SlimResNet`); they are not part of what is saved.
  """
  path = os.path.abspath(path)
  with open(os.path.join(path, ARCHITECTURE)) as f:
    specs, extra = spec_lib.loads(f.read())
  if len(specs) == 1 and "member_execution" not in extra:
    model = SlimResNet(specs[0], conv, inject)
  else:
    model = SlimEnResNet(tuple(specs), extra.get("member_execution",
                                                 "batched"), conv, inject)
  x = jnp.zeros((1, 8, 8, specs[0].stem.in_full), jnp.float32)
  template = jax.eval_shape(
      functools.partial(model.init, add_noise=False),
      {"params": jax.random.key(0)}, x)
  template = {"params": template["params"],
              "batch_stats": template.get("batch_stats", {})}
  with ocp.StandardCheckpointer() as checkpointer:
    variables = checkpointer.restore(os.path.join(path, VARIABLES), template)
  return model, variables, extra


def load_slim(path: str, conv: Callable = lax.conv_general_dilated,
              inject: Callable | None = None) -> tuple[Callable, PyTree]:
  """``(apply_fn, variables)`` of a saved slim model.

  ``apply_fn(variables, images, key) -> logits`` (noise drawn from ``key``
  when the model injects noise), the form :mod:`fkjax.attacks` and
  :mod:`fkjax.evaluation` take.
  """
  model, variables, _ = load_slim_model(path, conv, inject)

  def apply_fn(variables, images, key):
    return model.apply(variables, images, rngs={"noise": key})
  return apply_fn, variables
