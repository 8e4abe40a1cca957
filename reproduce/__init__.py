"""Every table and figure of the paper as one runnable experiment.

    python -m reproduce table1 --scale=cpu
    python -m reproduce all --scale=paper --dry-run

See docs/reproduction.md. Tables are data (:mod:`reproduce.tables`),
scales are data (:mod:`reproduce.scales`), and the runner
(:mod:`reproduce.runner`) trains and evaluates each row in its own
workdir through ``fkjax.training.train.train_and_evaluate`` and
``fkjax.evaluation.run.evaluate_checkpoint``.
"""
