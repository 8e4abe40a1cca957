"""Mixed precision of the training steps (``config.precision``).

``"float32"`` is the paper's. With ``"bfloat16"`` a training step's forward
and backward passes (the attack's and the update's) compute in bfloat16,
while the weights, their gradients, the optimizer state, the BatchNorm
statistics, the logits and the loss stay float32: the model applied is
:class:`ComputeIn`, which casts the parameters and the input on the way in
and the logits and statistics on the way out. Validation and evaluation run
in float32 whatever the setting.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

PyTree = Any
PRECISIONS = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _cast_floats(tree: PyTree, dtype) -> PyTree:
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, tree)


class ComputeIn:
  """``model`` computing in ``dtype``; its ``apply`` takes and returns what
  the float32 model's does (float32 variables, logits and statistics)."""

  def __init__(self, model, dtype):
    self.model, self.dtype = model, dtype

  def apply(self, variables: PyTree, x: jax.Array, *args,
            mutable: Any = False, **kwargs) -> Any:
    variables = {**variables,
                 "params": _cast_floats(variables["params"], self.dtype)}
    out = self.model.apply(variables, x.astype(self.dtype), *args,
                           mutable=mutable, **kwargs)
    if mutable:
      logits, updated = out
      return logits.astype(jnp.float32), _cast_floats(updated, jnp.float32)
    return out.astype(jnp.float32)


def training_model(model, config: ml_collections.ConfigDict):
  """The model a training step applies: ``model`` itself in float32 (the
  same program as before this option existed), else :class:`ComputeIn`."""
  name = config.get("precision", "float32")
  return model if name == "float32" else ComputeIn(model, PRECISIONS[name])
