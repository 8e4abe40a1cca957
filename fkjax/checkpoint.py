"""Orbax checkpoints: the latest state (to resume) and the best one.

``<workdir>/checkpoints/latest`` keeps the last two training states;
``<workdir>/checkpoints/best`` keeps the one with the highest validation
accuracy. Orbax writes each checkpoint to a temporary directory and renames it
when complete, so a process killed during a save (even ``kill -9``) leaves the
previous checkpoint intact and the partial one is ignored.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint is missing, corrupt, or does not match the config."""


def _manager(directory: str, best: bool, must_exist: bool = False
             ) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=1 if best else 2,
      best_fn=(lambda metrics: metrics["val_accuracy"]) if best else None,
      best_mode="max",
      create=not must_exist,  # eval must not create an empty run
      # Saves are rare (once an epoch) and must be complete before a crash
      # test or eval reads them, so keep them synchronous.
      enable_async_checkpointing=False,
  )
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


class Checkpointer:
  """Saves and restores training states under ``<workdir>/checkpoints``."""

  def __init__(self, workdir: str, must_exist: bool = False):
    root = os.path.join(workdir, "checkpoints")
    if must_exist and not os.path.isdir(root):
      raise CheckpointError(
          f"no checkpoints in {os.path.abspath(workdir)!r}: expected the "
          f"directory {root!r} written by train.py")
    self.latest = _manager(os.path.join(root, "latest"), False, must_exist)
    self.best = _manager(os.path.join(root, "best"), True, must_exist)

  def save(self, step: int, state: Any, val_accuracy: float | None = None
           ) -> None:
    """Saves ``state`` as the latest, and as the best if it beats it."""
    self.latest.save(step, args=ocp.args.StandardSave(state), force=True)
    if val_accuracy is not None:
      self.best.save(step, args=ocp.args.StandardSave(state),
                     metrics={"val_accuracy": float(val_accuracy)}, force=True)
    self.latest.wait_until_finished()
    self.best.wait_until_finished()

  def latest_step(self) -> int | None:
    return self.latest.latest_step()

  def best_step(self) -> int | None:
    return self.best.best_step()

  def restore(self, template: Any, which: str = "latest",
              step: int | None = None) -> tuple[int, Any]:
    """Restores into the structure, shapes and shardings of ``template``.

    Args:
      template: a state of the expected structure (arrays or
        ``jax.ShapeDtypeStruct``s).
      which: ``"latest"`` or ``"best"``.
      step: a specific step; default the latest (or best) one.

    Returns:
      ``(step, state)``.

    Raises:
      CheckpointError: nothing to restore, or the checkpoint does not match
        ``template`` (another model or optimizer than the config says), or it
        cannot be read.
    """
    manager = {"latest": self.latest, "best": self.best}[which]
    if step is None:
      step = manager.best_step() if which == "best" else manager.latest_step()
    if step is None:
      raise CheckpointError(f"no {which} checkpoint in {manager.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
      state = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # orbax raises many types; name the cause
      raise CheckpointError(
          f"could not restore the {which} checkpoint at step {step} from "
          f"{manager.directory}: {type(e).__name__}: {e}. Is it complete, and "
          "was it written with the same model/optimizer config?") from e
    _check_same_structure(template, state, f"{manager.directory}/{step}")
    return step, state

  def close(self) -> None:
    self.latest.close()
    self.best.close()


def _check_same_structure(template: Any, state: Any, where: str) -> None:
  want = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), template)
  got = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), state)
  if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
    raise CheckpointError(
        f"checkpoint {where} does not match the config's model/optimizer: "
        "different parameter structure or shapes")


def has_checkpoints(workdir: str) -> bool:
  """Whether ``workdir`` holds a run's checkpoints (any complete step)."""
  root = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(root):
    return False
  for sub in ("latest", "best"):
    d = os.path.join(root, sub)
    if os.path.isdir(d) and any(name.isdigit() for name in os.listdir(d)):
      return True
  return False
