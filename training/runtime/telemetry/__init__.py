"""Live metrics: CloudWatch Embedded Metric Format records from the trainer and launcher (docs/metrics.md).

`catalog` names every metric once (the stacks' dashboard and alarms import it), `settings` reads the sink
from the pod's environment, `emf` formats and ships the records, `trainer` and `launcher` turn each
process's events into metric values. Nothing here imports boto3: the CloudWatch agent on the node sends
the records on.
"""
