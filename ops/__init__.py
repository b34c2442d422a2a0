"""Operations: safe teardown (`python -m fsdpkit.ops.teardown`) and cost reports (`python -m
fsdpkit.ops.cost_report`).

`ops/` imports boto3; of the kit's other parts only the shared names in `fsdpkit.contracts`, the shared
strict parser `cliargs.py` (stdlib only) and, for `make plan` (`python -m fsdpkit.ops.plan`), infra's typed
config
(tools/import_rules.py, `PART_EDGES`). The cost report's optional fault-cost section reads a run's metrics as
`python -m fsdpkit.analysis.report RUN_DIR --json` prints them, run as a subprocess.
"""
