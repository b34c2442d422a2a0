"""Leftover network interfaces in the kit's VPCs (VPC CNI leaks, pitfall 3): they block SG, subnet and VPC
deletion.

Only `available` (detached) ENIs are candidates, so nothing in use is touched; ownership needs a kit tag, a
kit cluster's owner tag, or the VPC CNI's node tag. Untagged ones are kept and reported (they may block the
VPC).
"""

from __future__ import annotations

from ops.aws import Aws
from ops.tags import PROJECT_TAG, tag_dict
from ops.teardown.kinds import managed_by_stack
from ops.teardown.model import Kind, Resource, Scope


def list_enis(aws: Aws, scope: Scope) -> list[Resource]:
    ec2 = aws.client("ec2")
    available = {"Name": "status", "Values": ["available"]}
    queries = [[{"Name": f"tag:{PROJECT_TAG}", "Values": [scope.prefix]}, available]]
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
    if eni.get("RequesterManaged"):
        return None  # AWS services own these (ELB, FSx, Lambda); they go with their owner
    t = tag_dict(eni.get("TagSet"))
    if managed_by_stack(eni["NetworkInterfaceId"], t, scope.stack_resources):
        return None
    return Resource(
        kind="eni",
        id=eni["NetworkInterfaceId"],
        name=eni.get("Description", ""),
        tags=t,
        detail={"vpc_id": eni.get("VpcId"), "subnet_ids": (eni.get("SubnetId"),)},
    )


def delete_eni(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ec2").delete_network_interface(NetworkInterfaceId=r.id)


KIND = Kind(name="eni", title="Leftover network interfaces", list=list_enis, delete=delete_eni)
