"""Accuracy under a suite of attacks: the one import for users.

The evaluation lives in small modules, each with one job; this module
gathers their public names:

* ``fkjax.eval_names``: the attack and column names (``PAPER_COLUMNS``,
  ``COLUMN_LABELS``, ``STRONG_COLUMNS``), defined once;
* ``fkjax.eval_suites``: the protocols' attack suites, registered by name
  (``default_attacks``: the paper's A1..A5; ``strong_attacks``: APGD);
* ``fkjax.eval_loop``: the loop over batches (``Evaluator``,
  ``robust_accuracy``, ``predict_probs``, ``real_rows``);
* ``fkjax.eval_result``: what an evaluation returns (``EvalResult``, one
  ``AttackResult`` per attack; ``to_json``/``from_json`` its file form);
* ``fkjax.eval_progress``: progress in model calls, an optional layer
  (``CallCounter``, ``counting_apply``, ``count_model_calls``);
* ``fkjax.eval_strong``: the strong protocol (``strong_evaluation``, the
  per-image ``worst_case``, ``repeat_evaluation`` over seeds);
* ``fkjax.eval_tables``: the printed tables (``format_table``,
  ``format_strong``).
"""
from fkjax.eval_loop import Evaluator
from fkjax.eval_loop import Tally
from fkjax.eval_loop import predict_probs
from fkjax.eval_loop import real_rows
from fkjax.eval_loop import robust_accuracy
from fkjax.eval_loop import to_host
from fkjax.eval_names import COLUMN_LABELS
from fkjax.eval_names import PAPER_COLUMNS
from fkjax.eval_names import STRONG_COLUMNS
from fkjax.eval_progress import CallCounter
from fkjax.eval_result import AttackResult
from fkjax.eval_result import EvalResult
from fkjax.eval_progress import count_model_calls
from fkjax.eval_progress import counting_apply
from fkjax.eval_strong import repeat_evaluation
from fkjax.eval_strong import strong_evaluation
from fkjax.eval_strong import worst_case
from fkjax.eval_strong import worst_case_over_seeds
from fkjax.eval_suites import STOCHASTIC_CHECK_DRAWS
from fkjax.eval_suites import STOCHASTIC_EOT_SAMPLES
from fkjax.eval_suites import Attack
from fkjax.eval_suites import default_attacks
from fkjax.eval_suites import natural
from fkjax.eval_suites import strong_attacks
from fkjax.eval_suites import strong_settings
from fkjax.eval_tables import format_strong
from fkjax.eval_tables import format_table

__all__ = [
    "Attack",
    "AttackResult",
    "COLUMN_LABELS",
    "CallCounter",
    "EvalResult",
    "Evaluator",
    "PAPER_COLUMNS",
    "STOCHASTIC_CHECK_DRAWS",
    "STOCHASTIC_EOT_SAMPLES",
    "STRONG_COLUMNS",
    "Tally",
    "count_model_calls",
    "counting_apply",
    "default_attacks",
    "format_strong",
    "format_table",
    "natural",
    "predict_probs",
    "real_rows",
    "repeat_evaluation",
    "robust_accuracy",
    "strong_attacks",
    "strong_evaluation",
    "strong_settings",
    "to_host",
    "worst_case",
    "worst_case_over_seeds",
]
