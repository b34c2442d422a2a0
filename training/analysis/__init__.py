"""After the fact, from a run's events: `metrics` (every definition, once), `report` (`python -m
fsdpkit.analysis.report RUN_DIR`: tables and the timeline PNG), `batch_ledger` (the samples each step took,
two runs compared), `dashboard_preview` (the stacks' dashboard drawn from a local run's metric records)."""
