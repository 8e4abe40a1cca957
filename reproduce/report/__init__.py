"""Reporting the runs: each table's files (:mod:`reproduce.report.report`)
and figures (:mod:`reproduce.report.figures`), the paper's claims judged
(:mod:`reproduce.report.claims`) and every row in one table
(:mod:`reproduce.report.overview`)."""
