"""``argparse`` types for the numbers fkjax's command lines take.

Each turns a bad value into argparse's one line (``error: argument --batch:
'0' is not a positive integer``, exit status 2) instead of an empty run, a
division by zero or a traceback later on.
"""
from __future__ import annotations

import argparse
import math


def _integer(text: str, minimum: int, what: str) -> int:
  try:
    value = int(text)
  except ValueError:
    value = None
  if value is None or value < minimum:
    raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
  return value


def positive_int(text: str) -> int:
  """An integer ≥ 1 (a batch size, a number of steps)."""
  return _integer(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
  """An integer ≥ 0 (warm-up runs, where none is a valid choice)."""
  return _integer(text, 0, "a non-negative integer")


def positive_seconds(text: str) -> float:
  """A finite number of seconds > 0 (a timeout)."""
  try:
    seconds = float(text)
  except ValueError:
    seconds = math.nan
  if not 0 < seconds < math.inf:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a positive number of seconds")
  return seconds


def fraction(text: str) -> float:
  """A number in [0, 1] (a share of the images)."""
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not 0 <= value <= 1:
    raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1]")
  return value


def positive_int_list(text: str) -> list[int]:
  """Comma-separated integers ≥ 1 (``1,2,4``)."""
  try:
    return [positive_int(part) for part in text.split(",")]
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a comma-separated list of positive integers"
    ) from None
