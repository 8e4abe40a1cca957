"""One-off CPU experiments behind docs/performance.md ("what was tried")."""
