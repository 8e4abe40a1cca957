"""Training: the PGD step (``step``), the one loop of a run or a sweep
(``train``, ``program``), validation, the mesh, precision."""
