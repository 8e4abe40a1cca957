"""Accuracy under a suite of attacks: the one import for users.

The evaluation lives in small modules, each with one job; this module
gathers their public names:

* ``fkjax.config.names``: the attack and column names (``PAPER_COLUMNS``,
  ``COLUMN_LABELS``, ``STRONG_COLUMNS``), defined once;
* ``fkjax.evaluation.suites``: the protocols' attack suites, registered by name
  (``default_attacks``: the paper's A1..A5; ``strong_attacks``: APGD);
* ``fkjax.evaluation.loop``: the loop over batches (``Evaluator``,
  ``robust_accuracy``, ``predict_probs``, ``real_rows``);
* ``fkjax.evaluation.result``: what an evaluation returns (``EvalResult``, one
  ``AttackResult`` per attack; ``to_json``/``from_json`` its file form);
* ``fkjax.evaluation.progress``: progress in model calls, an optional layer
  (``CallCounter``, ``counting_apply``, ``count_model_calls``);
* ``fkjax.evaluation.strong``: the strong protocol (``strong_evaluation``, the
  per-image ``worst_case``, ``repeat_evaluation`` over seeds);
* ``fkjax.evaluation.tables``: the printed tables (``format_table``,
  ``format_strong``).
"""
from fkjax.evaluation.loop import Evaluator
from fkjax.evaluation.loop import Tally
from fkjax.evaluation.loop import predict_probs
from fkjax.evaluation.loop import real_rows
from fkjax.evaluation.loop import robust_accuracy
from fkjax.evaluation.loop import to_host
from fkjax.config.names import COLUMN_LABELS
from fkjax.config.names import PAPER_COLUMNS
from fkjax.config.names import STRONG_COLUMNS
from fkjax.evaluation.progress import CallCounter
from fkjax.evaluation.result import AttackResult
from fkjax.evaluation.result import EvalResult
from fkjax.evaluation.progress import count_model_calls
from fkjax.evaluation.progress import counting_apply
from fkjax.evaluation.strong import repeat_evaluation
from fkjax.evaluation.strong import strong_evaluation
from fkjax.evaluation.strong import worst_case
from fkjax.evaluation.strong import worst_case_over_seeds
from fkjax.evaluation.suites import STOCHASTIC_CHECK_DRAWS
from fkjax.evaluation.suites import STOCHASTIC_EOT_SAMPLES
from fkjax.evaluation.suites import Attack
from fkjax.evaluation.suites import default_attacks
from fkjax.evaluation.suites import natural
from fkjax.evaluation.suites import strong_attacks
from fkjax.evaluation.suites import strong_settings
from fkjax.evaluation.tables import format_strong
from fkjax.evaluation.tables import format_table

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
