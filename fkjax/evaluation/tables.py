"""The printed tables of an evaluation: the paper's row, the strong text."""
from __future__ import annotations

from fkjax.config.names import COLUMN_LABELS
from fkjax.config.names import STRONG_COLUMNS
from fkjax.evaluation.result import EvalResult
from fkjax.evaluation.strong_result import RepeatedResult
from fkjax.evaluation.strong_result import StrongResult


def format_table(results: EvalResult,
                 sparsity: float | None = None,
                 channel_sparsity: float | None = None) -> str:
  """A Markdown row like the paper's tables: A1..A5, sparsity, channel sparsity.

  Args:
    results: the result of ``robust_accuracy``.
    sparsity: percentage of zero weights, shown when given.
    channel_sparsity: percentage of channels with l2 norm < 1e-15, shown when
      given.

  Returns:
    A three-line Markdown table (header, rule, values; percentages with two
    decimals, as in the paper).
  """
  header, values = [], []
  for name, accuracy in results.accuracies().items():
    header.append(COLUMN_LABELS.get(name, name))
    values.append(f"{accuracy:.2f}")
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


def format_strong(results: RepeatedResult) -> str:
  """Text of a ``strong_evaluation`` (or ``repeat_evaluation``) result: one
  line per attack, the worst case, the settings and the sanity report (if
  it ran)."""
  strong = isinstance(results, StrongResult)
  lines = [results.description if strong else "strong protocol",
           f"{results.num_examples} images; accuracy % (mean +- std over "
           f"{results.num_seeds} seed(s)); seconds (all seeds)"]
  width = max(len(STRONG_COLUMNS.get(n, n)) for n in
              results.names + ["worst_case"])
  for name, entry in results.attacks.items():
    label = STRONG_COLUMNS.get(name, name)
    lines.append(f"  {label:<{width}}  {entry.accuracy.mean:6.2f} +- "
                 f"{entry.accuracy.std:5.2f}  {entry.seconds:8.1f} s")
  if results.worst_case is not None:
    w = results.worst_case
    label = STRONG_COLUMNS["worst_case"]
    lines.append(
        f"  {label:<{width}}  {w.accuracy:6.2f} (every attack, every "
        f"seed: {w.correct}/{w.num_examples} images); per seed "
        f"{w.each_seed.mean:.2f} +- {w.each_seed.std:.2f} (min "
        f"{min(w.each_seed.per_seed):.2f}, max "
        f"{max(w.each_seed.per_seed):.2f})")
  if strong and results.sanity_text is not None:
    lines.append(results.sanity_text)
  return "\n".join(lines)
