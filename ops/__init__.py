"""Operations: safe teardown (`python -m ops.teardown`) and cost reports (`python -m ops.cost_report`).

`ops/` imports boto3; of the kit's other parts only the shared names in `training.contracts`, the shared
strict parser `cliargs.py` (stdlib only) and, for `make plan` (`python -m ops.plan`), infra's typed config
(tools/import_rules.py, `PART_EDGES`). The cost report's optional fault-cost section reads a run's metrics as
`python -m training.analysis.report RUN_DIR --json` prints them, run as a subprocess.
"""
