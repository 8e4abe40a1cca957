"""Every table and figure of the paper as one runnable experiment.

    python -m fkjax.reproduce table1 --scale=cpu
    python -m fkjax.reproduce all --scale=paper --dry-run

See docs/reproduction.md. Tables are data (:mod:`fkjax.reproduce.tables`),
scales are data (:mod:`fkjax.reproduce.scales`), and the runner
(:mod:`fkjax.reproduce.runner`) trains and evaluates each row in its own
workdir through ``fkjax.train.train_and_evaluate`` and
``fkjax.eval_run.evaluate_checkpoint``.
"""
