"""EC2 instances the kit owns outside its node groups (a self-managed node, a p5 started by hand with the
kit's tags): they bill by the hour, hold ENIs in the kit's subnets and use its security groups.

Instances of a node group that still exists, or of an Auto Scaling group, are kept with that reason: their
group replaces what is terminated and deletes them itself (node groups go in the step before). Instances of
an Auto Scaling group that a live kit stack holds are left out: the stack step deletes the group later in the
order, and the group its instances. Termination
protection is respected, never switched off.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG, tag_dict
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.model import Kind, Resource, Scope, State

LIVE_STATES = ("pending", "running", "stopping", "stopped")
NODEGROUP_TAG = "eks:nodegroup-name"
CLUSTER_TAG = "eks:cluster-name"
ASG_TAG = "aws:autoscaling:groupName"


def _candidates(aws: Aws, scope: Scope) -> dict[str, dict]:
    """Live instances with the kit tag, or in a kit VPC, or of a kit cluster (by the EKS tag)."""
    ec2 = aws.client("ec2")
    live = {"Name": "instance-state-name", "Values": list(LIVE_STATES)}
    queries = [[{"Name": f"tag:{PROJECT_TAG}", "Values": [scope.prefix]}, live]]
    if scope.vpcs:
        queries.append([{"Name": "vpc-id", "Values": list(scope.vpcs)}, live])
    if scope.owner_clusters:
        queries.append([{"Name": f"tag:{CLUSTER_TAG}", "Values": list(scope.owner_clusters)}, live])
    found: dict[str, dict] = {}
    for filters in queries:
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for i in reservation["Instances"]:
                    found.setdefault(i["InstanceId"], i)
    return found


def _nodegroup_exists(aws: Aws, cluster: str, name: str) -> bool:
    """Whether the node group still exists, in any cluster (a kit-tagged group may sit in someone's)."""
    eks = aws.client("eks")
    try:
        eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)
    except eks.exceptions.ResourceNotFoundException:
        return False
    return True


def list_instances(aws: Aws, scope: Scope) -> list[Resource]:
    ec2 = aws.client("ec2")
    nodegroups: dict[str, bool] = {}
    found = []
    for iid, i in sorted(_candidates(aws, scope).items()):
        t = tag_dict(i.get("Tags"))
        if managed_by_stack(iid, t, scope.stack_resources) or t.get(ASG_TAG) in scope.stack_resources:
            continue  # a kit stack deletes it, or deletes its Auto Scaling group (which terminates it)
        detail: dict[str, object] = {
            "vpc_id": i.get("VpcId"),
            "subnet_ids": (i.get("SubnetId"),),
            "type": i.get("InstanceType", ""),
            "state": i["State"]["Name"],
            "created": i.get("LaunchTime"),
            "note": f"{i.get('InstanceType', '')} {i['State']['Name']}",
        }
        r = Resource(kind="instance", id=iid, name=t.get("Name", ""), tags=t, detail=detail)
        if ownership(r, scope) is None:
            found.append(r)  # in a kit VPC but not owned: listed so the report says it stays (and may block)
            continue
        if NODEGROUP_TAG in t:
            cluster = t.get(CLUSTER_TAG, "")
            group = f"{cluster}/{t[NODEGROUP_TAG]}"
            if group not in nodegroups:
                nodegroups[group] = bool(cluster) and _nodegroup_exists(aws, cluster, t[NODEGROUP_TAG])
            if nodegroups[group]:
                detail["keep_reason"] = f"a node of node group {group}: it goes with the node group"
        elif ASG_TAG in t:
            detail["keep_reason"] = (
                f"in Auto Scaling group {t[ASG_TAG]}, which would replace it: delete the group (or its stack)"
            )
        attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="disableApiTermination")
        if attr.get("DisableApiTermination", {}).get("Value"):
            detail["protected"] = "termination protection is on; turn it off yourself if you mean it"
        found.append(r)  # `detail` is r's own dict: the keep reasons above are already in it
    return found


def terminate_instance(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ec2").terminate_instances(InstanceIds=[r.id])


def instance_state(aws: Aws, r: Resource) -> tuple[State, str]:
    pages = aws.client("ec2").describe_instances(InstanceIds=[r.id])["Reservations"]
    states = [i["State"]["Name"] for res in pages for i in res["Instances"]]
    if not states or states[0] == "terminated":
        return "gone", ""
    return "deleting", states[0]


KIND = Kind(
    name="instance",
    title="EC2 instances outside node groups",
    list=list_instances,
    delete=terminate_instance,
    state=instance_state,
)
