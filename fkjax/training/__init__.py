"""Training: the PGD step, the epoch loop (a run or a sweep), the mesh, precision."""
