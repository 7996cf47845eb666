"""A run's record-level parts: launch, preflight, checkpoints, rules, warm start, effective config."""
