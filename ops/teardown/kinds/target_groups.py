"""ELBv2 target groups of the controller, after their LBs (ResourceInUse while a listener uses them)."""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.kinds.load_balancers import elb_tags
from fsdpkit.ops.teardown.model import Kind, Resource, Scope


def list_target_groups(aws: Aws, scope: Scope) -> list[Resource]:
    elbv2 = aws.client("elbv2")
    tgs = [
        tg for page in elbv2.get_paginator("describe_target_groups").paginate() for tg in page["TargetGroups"]
    ]
    tags = elb_tags(aws, [tg["TargetGroupArn"] for tg in tgs])
    found = []
    for tg in tgs:
        t = tags.get(tg["TargetGroupArn"], {})
        if managed_by_stack(tg["TargetGroupArn"], t, scope.stack_resources):
            continue
        r = Resource(
            kind="target-group",
            id=tg["TargetGroupArn"],
            name=tg["TargetGroupName"],
            tags=t,
            detail={"vpc_id": tg.get("VpcId")},
        )
        if tg.get("VpcId") in scope.vpcs or ownership(r, scope) is not None:
            found.append(r)
    return found


def delete_target_group(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("elbv2").delete_target_group(TargetGroupArn=r.id)


KIND = Kind(
    name="target-group",
    title="Target groups made by Kubernetes",
    list=list_target_groups,
    delete=delete_target_group,
)
