"""Running a table: which runs it has (:mod:`reproduce.run.plan`), where
each stands (:mod:`reproduce.run.standing`), running and recording them
(:mod:`reproduce.run.execute`, :mod:`reproduce.run.records`,
:mod:`reproduce.run.sweeps`), their copies under ``results/``
(:mod:`reproduce.run.archive`) and their time before they run
(:mod:`reproduce.run.estimate`, for this machine
:mod:`reproduce.run.calibrate`, for a measured GPU
:mod:`reproduce.run.measured_speed`)."""
