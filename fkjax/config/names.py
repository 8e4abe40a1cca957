"""The names of the evaluation's attacks and of its table columns, once.

Every other list of attack names is derived from these:
``fkjax.evaluation.suites.default_attacks`` keys its attacks by ``PAPER_COLUMNS``,
``fkjax.evaluation.suites.attack_suite`` accepts ``ATTACK_NAMES``,
``fkjax.config.record`` validates ``config.eval.attacks`` against them, and the
tables label their columns with ``COLUMN_LABELS`` and ``STRONG_COLUMNS``.
This module imports nothing, so that the config's validation can read it
without JAX.
"""
from __future__ import annotations

# Short result keys of the paper's columns, in the paper's order, and how the
# table labels them.
PAPER_COLUMNS: dict[str, str] = {
    "natural": "A1 natural",
    "fgsm": "A2 FGSM",
    "ifgsm20": "A3 IFGSM20",
    "cw": "A4 C&W-linf",
    "nattack": "A5 NAttack",
}

# The authors' variants of a paper column (their attack script's), which
# ``config.eval.attacks`` may name beside the paper's.
AUTHORS_COLUMNS: dict[str, str] = {
    "cw_authors": "A4 C&W (authors')",
}

# Labels of every column a paper-protocol table may hold.
COLUMN_LABELS: dict[str, str] = {**PAPER_COLUMNS, **AUTHORS_COLUMNS}

# The attacks ``config.eval.attacks`` may name, in table order.
ATTACK_NAMES: tuple[str, ...] = tuple(COLUMN_LABELS)

# The strong protocol's attacks and its worst case, as its table labels them.
STRONG_COLUMNS: dict[str, str] = {
    "natural": "natural",
    "apgd_ce": "APGD-CE",
    "apgd_dlr": "APGD-DLR",
    "apgd_t": "APGD-T",
    "worst_case": "worst case",
}

# config.sparsity.method's values: what fkjax.sparsity.METHODS registers
# (a test keeps them equal), here so that a wrong name is refused before
# JAX loads.
SPARSITY_METHODS: tuple[str, ...] = ("none", "rvsm", "rgsm", "admm")
