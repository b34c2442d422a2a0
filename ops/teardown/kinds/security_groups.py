"""Security groups the Load Balancer Controller created (pitfall 2), in the kit's VPCs.

Groups CloudFormation made are left to the stack step. Before deleting, rules in other kit-owned groups
that reference a doomed group are revoked (otherwise DependencyViolation forever); a reference from a group
the kit does not own is left alone and the deletion is reported as failed with that reason.
"""

from __future__ import annotations

import botocore.exceptions

from fsdpkit.ops.aws import Aws, describe_error
from fsdpkit.ops.tags import PROJECT_TAG, tag_dict
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.model import Kind, Prepared, Resource, Scope


def _groups(aws: Aws, scope: Scope) -> list[dict]:
    """Every group in a kit VPC, plus kit-tagged groups elsewhere."""
    ec2 = aws.client("ec2")
    queries = [[{"Name": f"tag:{PROJECT_TAG}", "Values": [scope.prefix]}]]
    if scope.vpcs:
        queries.append([{"Name": "vpc-id", "Values": list(scope.vpcs)}])
    found: dict[str, dict] = {}
    for filters in queries:
        for page in ec2.get_paginator("describe_security_groups").paginate(Filters=filters):
            for g in page["SecurityGroups"]:
                found.setdefault(g["GroupId"], g)
    return [found[k] for k in sorted(found)]


def list_security_groups(aws: Aws, scope: Scope) -> list[Resource]:
    found = []
    for g in _groups(aws, scope):
        t = tag_dict(g.get("Tags"))
        if g["GroupName"] == "default" or managed_by_stack(g["GroupId"], t, scope.stack_resources):
            continue
        found.append(
            Resource(
                kind="security-group",
                id=g["GroupId"],
                name=g["GroupName"],
                tags=t,
                detail={"vpc_id": g.get("VpcId")},
            )
        )
    return found


def revoke_references(aws: Aws, doomed: list[Resource], scope: Scope) -> Prepared:
    """Revoke rules in kit-owned groups that point at a doomed group; the notes say what it did."""
    ec2 = aws.client("ec2")
    ids = {r.id for r in doomed}
    notes = []
    for g in _groups(aws, scope):
        holder = Resource(
            kind="security-group",
            id=g["GroupId"],
            tags=tag_dict(g.get("Tags")),
            detail={"vpc_id": g.get("VpcId")},
        )
        if ownership(holder, scope) is None:
            continue
        for perms_key, revoke in (
            ("IpPermissions", ec2.revoke_security_group_ingress),
            ("IpPermissionsEgress", ec2.revoke_security_group_egress),
        ):
            for perm in g.get(perms_key, []):
                pairs = [p for p in perm.get("UserIdGroupPairs", []) if p.get("GroupId") in ids]
                if not pairs:
                    continue
                rule = {k: v for k, v in perm.items() if k in ("IpProtocol", "FromPort", "ToPort")}
                rule["UserIdGroupPairs"] = [{"GroupId": p["GroupId"]} for p in pairs]
                try:
                    revoke(GroupId=g["GroupId"], IpPermissions=[rule])
                    notes.append(f"revoked rule in {g['GroupId']} referencing {pairs[0]['GroupId']}")
                except botocore.exceptions.ClientError as exc:
                    notes.append(f"could not revoke rule in {g['GroupId']}: {describe_error(exc)}")
    return Prepared(notes=notes)


def delete_security_group(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ec2").delete_security_group(GroupId=r.id)


KIND = Kind(
    name="security-group",
    title="Controller security groups",
    list=list_security_groups,
    delete=delete_security_group,
    prepare=revoke_references,
)
