"""The jobs the CLI runs: train, sample, eval, replay, reproduce, compare, regression, screen, judge."""
