"""Digests of cross-stack references, so replacing a referenced resource redeploys its consumers.

Cross-stack references are weak (`Fn::GetStackOutput`, the `defaultCrossStackReferences` flag): when FSx or
the EFA security group is replaced, the producer's output changes but the consumer's template does not, and
`cdk deploy --all` skips the consumer, whose launch template and PV keep the old ids. A strong reference
(`Fn::ImportValue`) would block the replacement instead ("export in use"). So each consumer carries a digest
of the referenced resources' replacing properties (createOnlyProperties from the CloudFormation resource
schemas, plus those the FSx guide says are set only at creation); a change there changes the consumer's
template, and its deploy re-resolves every reference.
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
}
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


def replacing_inputs(resource: CfnResource, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resource's identity: stack, logical id and the values of its replacing properties.

    `overrides` are the `add_property_override` values the owning construct set (CFN names), which the L1's
    own property bag does not show.
    """
    stack = Stack.of(resource)
    props: dict[str, Any] = stack.resolve(resource._cfn_properties) or {}
    values: dict[str, Any] = {}
    for path in REPLACING_PROPERTIES[resource.cfn_resource_type]:
        value = (overrides or {}).get(path, _pick(props, path))
        if value is not None:
            values[path] = stack.resolve(value)
    return {"stack": stack.stack_name, "logicalId": stack.resolve(resource.logical_id), "properties": values}


def digest(*inputs: Mapping[str, Any]) -> str:
    """Short, stable hex digest of the given identities."""
    text = json.dumps(list(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
