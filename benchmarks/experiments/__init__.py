"""One-off CPU experiments behind benchmarks/results/cpu_alternatives/."""
