"""ELBv2 load balancers that the AWS Load Balancer Controller (or the in-tree provider) left behind.

They outlive the cluster, hold ENIs and public IPs in the subnets, and reference the controller's security
groups, so they block the network stack (pitfall 1). Deletion protection is respected, never switched off.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import tag_dict
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.model import Kind, Resource, Scope, State

TAG_BATCH = 20
"""describe_tags takes at most 20 ARNs per call."""


def elb_tags(aws: Aws, arns: list[str]) -> dict[str, dict[str, str]]:
    elbv2 = aws.client("elbv2")
    tags: dict[str, dict[str, str]] = {}
    for i in range(0, len(arns), TAG_BATCH):
        for d in elbv2.describe_tags(ResourceArns=arns[i : i + TAG_BATCH])["TagDescriptions"]:
            tags[d["ResourceArn"]] = tag_dict(d.get("Tags"))
    return tags


def list_load_balancers(aws: Aws, scope: Scope) -> list[Resource]:
    elbv2 = aws.client("elbv2")
    lbs = [
        lb
        for page in elbv2.get_paginator("describe_load_balancers").paginate()
        for lb in page["LoadBalancers"]
    ]
    tags = elb_tags(aws, [lb["LoadBalancerArn"] for lb in lbs])
    found = []
    for lb in lbs:
        arn = lb["LoadBalancerArn"]
        t = tags.get(arn, {})
        if managed_by_stack(arn, t, scope.stack_resources):
            continue
        r = Resource(
            kind="load-balancer",
            id=arn,
            name=lb["LoadBalancerName"],
            tags=t,
            detail={"vpc_id": lb.get("VpcId"), "created": lb.get("CreatedTime")},
        )
        if lb.get("VpcId") not in scope.vpcs and ownership(r, scope) is None:
            continue
        attrs = elbv2.describe_load_balancer_attributes(LoadBalancerArn=arn)["Attributes"]
        if any(a["Key"] == "deletion_protection.enabled" and a["Value"] == "true" for a in attrs):
            r = Resource(
                kind=r.kind,
                id=r.id,
                name=r.name,
                tags=t,
                detail={
                    **r.detail,
                    "protected": "deletion protection is on; turn it off yourself if you mean it",
                },
            )
        found.append(r)
    return found


def delete_load_balancer(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("elbv2").delete_load_balancer(LoadBalancerArn=r.id)


def load_balancer_state(aws: Aws, r: Resource) -> tuple[State, str]:
    lbs = aws.client("elbv2").describe_load_balancers(LoadBalancerArns=[r.id])["LoadBalancers"]
    return ("deleting", lbs[0]["State"]["Code"]) if lbs else ("gone", "")


KIND = Kind(
    name="load-balancer",
    title="Load balancers made by Kubernetes",
    list=list_load_balancers,
    delete=delete_load_balancer,
    state=load_balancer_state,
)
