"""Operations: safe teardown (`python -m ops.teardown`) and cost reports (`python -m ops.cost_report`).

`ops/` imports boto3 and never the other parts of the kit (design: folders and what they may import), but
the repository's shared strict parser `cliargs.py` (stdlib only); the one exception is the cost report's
optional fault-cost section, which reads a run folder through `training.analysis.metrics` lazily.
"""
