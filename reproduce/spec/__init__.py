"""What to run: the paper's tables as data (:mod:`reproduce.spec.tables`)
and the scales they run at (:mod:`reproduce.spec.scales`)."""
