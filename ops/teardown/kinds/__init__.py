"""One module per resource kind, each exporting `KIND` (ops.teardown.model.Kind); order: ../registry.py."""

CFN_STACK_TAG = "aws:cloudformation:stack-name"
"""CloudFormation tags what it creates; sweep kinds leave those to the stack step (it deletes in order)."""
