"""The kit's tag keys (contract 1). Teardown and cost reports select resources by exactly these keys."""

PROJECT_TAG = "kit:project"
"""Value: the config's `prefix`. Every AWS resource the kit creates carries it."""

STACK_TAG = "kit:stack"
"""Value: the CloudFormation stack name that owns the resource (e.g. `fsdp-kit-cluster`)."""
