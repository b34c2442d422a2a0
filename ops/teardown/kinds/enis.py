"""Leftover network interfaces in the kit's VPCs (VPC CNI leaks, pitfall 3): they block SG, subnet and VPC
deletion.

Only `available` (detached) ENIs are candidates, so nothing in use is touched; ownership needs a kit tag, a
kit cluster's owner tag, or the VPC CNI's node tag. Untagged ones are kept and reported (they may block the
VPC).
"""

from __future__ import annotations

from ops.aws import Aws
from ops.tags import tag_dict
from ops.teardown.kinds import managed_by_stack
from ops.teardown.model import Kind, Resource, Scope


def list_enis(aws: Aws, scope: Scope) -> list[Resource]:
    if not scope.vpcs:
        return []
    ec2 = aws.client("ec2")
    filters = [{"Name": "vpc-id", "Values": list(scope.vpcs)}, {"Name": "status", "Values": ["available"]}]
    found = []
    for page in ec2.get_paginator("describe_network_interfaces").paginate(Filters=filters):
        for eni in page["NetworkInterfaces"]:
            if eni.get("RequesterManaged"):
                continue  # AWS services own these (ELB, FSx, Lambda); they go with their owner
            t = tag_dict(eni.get("TagSet"))
            if managed_by_stack(eni["NetworkInterfaceId"], t, scope.stack_resources):
                continue
            found.append(
                Resource(
                    kind="eni",
                    id=eni["NetworkInterfaceId"],
                    name=eni.get("Description", ""),
                    tags=t,
                    detail={"vpc_id": eni.get("VpcId"), "subnet_ids": (eni.get("SubnetId"),)},
                )
            )
    return found


def delete_eni(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ec2").delete_network_interface(NetworkInterfaceId=r.id)


KIND = Kind(name="eni", title="Leftover network interfaces", list=list_enis, delete=delete_eni)
