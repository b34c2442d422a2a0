"""One module per resource kind, each exporting `KIND` (fsdpkit.ops.teardown.model.Kind); order:
../registry.py."""

from collections.abc import Mapping

CFN_STACK_TAG = "aws:cloudformation:stack-name"
"""CloudFormation tags what it creates; sweep kinds leave those to the stack step (it deletes in order)."""


def managed_by_stack(resource_id: str, tags: Mapping[str, str], stack_resources: frozenset[str]) -> bool:
    """True when a live kit stack owns it: the stack step deletes it, in CloudFormation's own order."""
    return CFN_STACK_TAG in tags or resource_id in stack_resources
