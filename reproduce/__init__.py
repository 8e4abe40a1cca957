"""Every table and figure of the paper as one runnable experiment.

    python -m reproduce table1 --scale=cpu
    python -m reproduce all --scale=paper --dry-run

See docs/reproduction.md. What to run is data (:mod:`reproduce.spec`: the
tables and the scales); :mod:`reproduce.run` trains and evaluates each row
in its own workdir through ``fkjax.training.train.train_and_evaluate`` and
``fkjax.evaluation.run.evaluate_checkpoint``; :mod:`reproduce.report`
writes the tables, figures and claims from the runs' files. Beside them,
the commands ``python -m reproduce.analysis`` (a run's weight statistics)
and ``python -m reproduce.pilot`` (pilot runs).
"""
