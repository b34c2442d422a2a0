"""Everything else the kit tagged: listed so the plan shows all of it, kept with the reason.

Runs last. A resource of a live kit stack goes with its stack (the stack step lists what each stack holds);
what is left here is kit-tagged but outside any stack (a VPC made by hand with the kit's tags, a stack's
leftover after DELETE_FAILED, a backup): teardown has no deleter for it, so it is kept and reported, never
silently ignored. Kinds with their own step are not repeated here.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import STACK_TAG
from fsdpkit.ops.teardown.kinds import CFN_STACK_TAG
from fsdpkit.ops.teardown.kinds.tagging import tagged
from fsdpkit.ops.teardown.model import DeleteFailed, Kind, Resource, Scope

HANDLED_TYPES = frozenset(
    {
        "ec2:instance",
        "ec2:volume",
        "ec2:security-group",
        "ec2:network-interface",
        "elasticloadbalancing:loadbalancer",
        "elasticloadbalancing:targetgroup",
        "fsx:file-system",
        "logs:log-group",
        "s3:bucket",
        "cloudformation:stack",
        "ecr:repository",
        "eks:cluster",
        "eks:nodegroup",
    }
)
"""Types that have their own step (registry.py); each of those lists every kit-tagged resource of its type."""

KEPT_ON_PURPOSE = {
    "fsx:backup": "FSx backups are kept on purpose (a final backup holds the checkpoints); "
    "delete it yourself when sure",
    "ec2:snapshot": "snapshots are data: teardown never deletes them; delete it yourself when sure",
}


def list_tagged(aws: Aws, scope: Scope) -> list[Resource]:
    found = []
    for t in tagged(aws, scope):
        in_live_stack = (
            t.id in scope.stack_resources
            or t.arn in scope.stack_resources
            or t.tags.get(CFN_STACK_TAG) in scope.stack_contents
        )
        if t.type in HANDLED_TYPES or in_live_stack:
            continue
        reason = KEPT_ON_PURPOSE.get(t.type) or (
            f"teardown has no deleter for {t.type} outside a stack"
            + (f" (its stack {t.tags[STACK_TAG]} is gone)" if STACK_TAG in t.tags else "")
            + "; delete it yourself"
        )
        found.append(
            Resource(
                kind="tagged",
                id=t.id,
                name=t.type,
                tags=t.tags,
                detail={"keep_reason": reason, "arn": t.arn},
            )
        )
    return sorted(found, key=lambda r: (r.name, r.id))


def no_delete(aws: Aws, r: Resource, scope: Scope) -> None:
    """A guard, never reached in a normal run: every item of this kind carries a `keep_reason`, so the
    filters keep it. Should one ever be planned for deletion, it fails with the reason, not silently."""
    raise DeleteFailed(f"no deleter for {r.name}")


KIND = Kind(name="tagged", title="Other kit-tagged resources", list=list_tagged, delete=no_delete)
