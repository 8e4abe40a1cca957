"""Errors of a training run that are the run's, not a bug's."""
from __future__ import annotations


class TrainingError(RuntimeError):
  """A run cannot go on as configured (e.g. it diverged)."""


class NonFiniteLossError(TrainingError, FloatingPointError):
  """The training loss became NaN or infinite, or blew up past a bound."""
