"""Live metrics: CloudWatch Embedded Metric Format records from the trainer and launcher (docs/metrics.md).

The catalog names every metric once and the settings say where records go (training/contracts:
`metrics_catalog`, `metrics_settings`); `emf` formats and ships the records, `source` is what both sides
share, `trainer` and `launcher` turn each process's events into metric values. Nothing here imports boto3:
the CloudWatch agent on the node sends the records on.
"""
