"""Leftover network interfaces in the kit's VPCs (VPC CNI leaks, pitfall 3): they block SG, subnet and VPC
deletion.

Only `available` (detached) ENIs are deleted, so nothing in use is touched; ownership needs a kit tag, a
kit cluster's owner tag, or the VPC CNI's node tag. Untagged ones are kept and reported (they may block the
VPC). A kit-tagged ENI that is in use, or that an AWS service manages, is listed as kept with what holds it:
every kit-tagged resource is in the plan.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG, tag_dict
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.model import Kind, Resource, Scope


def list_enis(aws: Aws, scope: Scope) -> list[Resource]:
    ec2 = aws.client("ec2")
    available = {"Name": "status", "Values": ["available"]}
    queries = [[{"Name": f"tag:{PROJECT_TAG}", "Values": [scope.prefix]}]]  # in use too: kept, but listed
    if scope.vpcs:
        queries.append([{"Name": "vpc-id", "Values": list(scope.vpcs)}, available])
    found = []
    seen: set[str] = set()
    for filters in queries:
        for page in ec2.get_paginator("describe_network_interfaces").paginate(Filters=filters):
            found += [e for e in page["NetworkInterfaces"] if e["NetworkInterfaceId"] not in seen]
            seen |= {e["NetworkInterfaceId"] for e in page["NetworkInterfaces"]}
    return [r for eni in found if (r := _resource(eni, scope)) is not None]


def _resource(eni: dict, scope: Scope) -> Resource | None:
    t = tag_dict(eni.get("TagSet"))
    kit_tagged = t.get(PROJECT_TAG) == scope.prefix
    if eni.get("RequesterManaged") and not kit_tagged:
        return None  # AWS services own these (ELB, FSx, Lambda); they go with their owner
    if managed_by_stack(eni["NetworkInterfaceId"], t, scope.stack_resources):
        return None
    detail: dict[str, object] = {"vpc_id": eni.get("VpcId"), "subnet_ids": (eni.get("SubnetId"),)}
    if (why := _held(eni)) is not None:
        detail["keep_reason"] = why
    return Resource(
        kind="eni", id=eni["NetworkInterfaceId"], name=eni.get("Description", ""), tags=t, detail=detail
    )


def _held(eni: dict) -> str | None:
    """Why an ENI cannot be deleted now (in use, or an AWS service's), or None when it is detached."""
    if eni.get("RequesterManaged"):
        return f"managed by {eni.get('RequesterId') or 'an AWS service'}: it goes with its owner"
    if eni.get("Status", "available") == "available":
        return None
    attachment = eni.get("Attachment") or {}
    holder = attachment.get("InstanceId") or attachment.get("InstanceOwnerId") or "something"
    return (
        f"in use ({eni['Status']}), attached to {holder}: teardown deletes only detached interfaces; "
        "a rerun deletes it once it is detached"
    )


def delete_eni(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ec2").delete_network_interface(NetworkInterfaceId=r.id)


KIND = Kind(name="eni", title="Leftover network interfaces", list=list_enis, delete=delete_eni)
