"""Tools that read run records and judge them: the reproducibility audit and the run-to-run diff."""
