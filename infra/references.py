"""Digests of cross-stack references, so replacing a referenced resource redeploys its consumers.

Cross-stack references are weak (`Fn::GetStackOutput`, the `defaultCrossStackReferences` flag): when FSx or
the EFA security group is replaced, the producer's output changes but the consumer's template does not, and
`cdk deploy --all` skips the consumer, whose launch template and PV keep the old ids. A strong reference
(`Fn::ImportValue`) would block the replacement instead ("export in use"). So each consumer carries a digest
of the referenced resources' replacing properties (createOnlyProperties from the CloudFormation resource
schemas, plus those the FSx guide says are set only at creation); a change there changes the consumer's
template, and its deploy re-resolves every reference.

A replacement cascades: a new FSx security group replaces the file system that names it. So a `Ref` or
`Fn::GetAtt` in a replacing property that points at another resource of the same stack is followed, and that
resource's identity (its own replacing properties, followed again) joins the digest. References into other
stacks (the network's VPC, subnets, EFA group) are not followed: docs/infra.md says what a network change
needs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from aws_cdk import CfnResource, Stack

REPLACING_PROPERTIES: dict[str, tuple[str, ...]] = {
    # createOnlyProperties of the AWS::FSx::FileSystem schema, plus DeploymentType and EfaEnabled, which
    # the FSx guide says are set only at creation.
    "AWS::FSx::FileSystem": (
        "BackupId",
        "FileSystemType",
        "KmsKeyId",
        "SecurityGroupIds",
        "SubnetIds",
        "StorageType",
        "LustreConfiguration.DeploymentType",
        "LustreConfiguration.EfaEnabled",
    ),
    # createOnlyProperties of the AWS::EC2::SecurityGroup schema.
    "AWS::EC2::SecurityGroup": ("GroupDescription", "GroupName", "VpcId"),
    # createOnlyProperties of the AWS::EC2::Subnet schema.
    "AWS::EC2::Subnet": (
        "AvailabilityZone",
        "AvailabilityZoneId",
        "CidrBlock",
        "Ipv4IpamPoolId",
        "Ipv4NetmaskLength",
        "Ipv6IpamPoolId",
        "Ipv6Native",
        "Ipv6NetmaskLength",
        "OutpostArn",
        "VpcId",
    ),
    # createOnlyProperties of the AWS::EC2::VPC schema.
    "AWS::EC2::VPC": ("CidrBlock", "Ipv4IpamPoolId", "Ipv4NetmaskLength", "VpcEncryptionControl"),
}
"""Resource types whose replacement the digest follows; other referenced resources count by type and id."""
DIGEST_CHARS = 10


def _camel(path: str) -> list[str]:
    return [part[0].lower() + part[1:] for part in path.split(".")]


def _pick(props: Mapping[str, Any], path: str) -> Any:
    node: Any = props
    for part in _camel(path):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _referenced_ids(value: Any) -> list[str]:
    """Logical ids named by `Ref` / `Fn::GetAtt` anywhere in a resolved value (pseudo parameters excluded)."""
    if isinstance(value, list):
        return [i for item in value for i in _referenced_ids(item)]
    if not isinstance(value, Mapping):
        return []
    if set(value) == {"Ref"} and isinstance(value["Ref"], str) and not value["Ref"].startswith("AWS::"):
        return [value["Ref"]]
    if set(value) == {"Fn::GetAtt"} and isinstance(value["Fn::GetAtt"], list):
        return [value["Fn::GetAtt"][0]]
    return [i for item in value.values() for i in _referenced_ids(item)]


def _resources_by_id(stack: Stack) -> dict[str, CfnResource]:
    """Logical id -> L1 resource, for every resource of `stack` (not of nested stages or other stacks)."""
    found: dict[str, CfnResource] = {}
    for child in stack.node.find_all():
        if CfnResource.is_cfn_resource(child) and Stack.of(child) is stack:
            found[stack.resolve(child.logical_id)] = child
    return found


def replacing_inputs(
    resource: CfnResource,
    overrides: Mapping[str, Any] | None = None,
    _seen: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The resource's identity: stack, type, logical id, the values of its replacing properties, and the
    identities of the same-stack resources those values reference (transitively).

    `overrides` are the `add_property_override` values the owning construct set (CFN names), which the L1's
    own property bag does not show. The bag is the private `_cfn_properties`: the digest is needed while the
    consumer stack is being built (it names the PV), before any template exists to read, and the L1s' public
    attributes are per type (no generic, name-keyed access).
    """
    stack = Stack.of(resource)
    logical_id = stack.resolve(resource.logical_id)
    props: dict[str, Any] = stack.resolve(resource._cfn_properties) or {}
    values: dict[str, Any] = {}
    for path in REPLACING_PROPERTIES.get(resource.cfn_resource_type, ()):
        value = (overrides or {}).get(path, _pick(props, path))
        if value is not None:
            values[path] = stack.resolve(value)
    local = _resources_by_id(stack)
    seen = _seen | {logical_id}
    upstream = {
        ref: replacing_inputs(local[ref], _seen=seen)
        for ref in sorted(set(_referenced_ids(values)))
        if ref in local and ref not in seen
    }
    return {
        "stack": stack.stack_name,
        "type": resource.cfn_resource_type,
        "logicalId": logical_id,
        "properties": values,
        "references": upstream,
    }


def digest(*inputs: Mapping[str, Any]) -> str:
    """Short, stable hex digest of the given identities."""
    text = json.dumps(list(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
