"""The kit's CloudFormation stacks, last, in waves: a stack that imports another's export goes first.

Found by the kit tag (not by a hard-coded list of names). Import edges come from the templates'
`Fn::ImportValue` (works everywhere; `list_imports` needs one call per export). A stack that ends in
DELETE_FAILED is reported with the failed resources and their reasons from the stack events; a stack with
termination protection is kept. Nested stacks are deleted by their parent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import botocore.exceptions

from fsdpkit.ops.aws import Aws, error_message
from fsdpkit.ops.tags import PROJECT_TAG, tag_dict
from fsdpkit.ops.teardown.model import DeleteFailed, Kind, Resource, Scope, State

GONE_STATUSES = ("DELETE_COMPLETE",)


def list_stacks(aws: Aws, scope: Scope) -> list[Resource]:
    cfn = aws.client("cloudformation")
    found = []
    for page in cfn.get_paginator("describe_stacks").paginate():
        for s in page["Stacks"]:
            tags = tag_dict(s.get("Tags"))
            if (
                tags.get(PROJECT_TAG) != scope.prefix
                or s["StackStatus"] in GONE_STATUSES
                or s.get("ParentId")
            ):
                continue
            contents = scope.stack_contents.get(s["StackName"])
            detail: dict[str, Any] = {
                "note": f"with its resources: {contents}" if contents else "",
                "stack_id": s["StackId"],
                "status": s["StackStatus"],
                "exports": tuple(o["ExportName"] for o in s.get("Outputs", []) if o.get("ExportName")),
            }
            if s.get("EnableTerminationProtection"):
                detail["protected"] = "termination protection is on; turn it off yourself if you mean it"
            found.append(
                Resource(kind="stack", id=s["StackName"], name=s["StackName"], tags=tags, detail=detail)
            )
    # Who imports whose exports, among the kit's stacks (kept ones included): an exporter may go only
    # after its importers (AWS refuses otherwise; moto does not, so this is checked here).
    imports = {r.id: imported_exports(aws, r) for r in found}
    return [
        Resource(
            kind=r.kind,
            id=r.id,
            name=r.name,
            tags=r.tags,
            detail={
                **r.detail,
                "imported_by": tuple(
                    sorted(o for o, used in imports.items() if o != r.id and used & set(r.detail["exports"]))
                ),
            },
        )
        for r in found
    ]


def _imports(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "Fn::ImportValue" and isinstance(v, str):
                yield v
            else:
                yield from _imports(v)
    elif isinstance(node, list):
        for v in node:
            yield from _imports(v)


def imported_exports(aws: Aws, stack: Resource) -> set[str]:
    body = aws.client("cloudformation").get_template(StackName=stack.detail["stack_id"])["TemplateBody"]
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError:  # YAML templates: the short form `!ImportValue name`
            return {
                line.split("!ImportValue", 1)[1].strip().strip("'\"")
                for line in body.splitlines()
                if "!ImportValue" in line
            }
    return set(_imports(body))


def waves(aws: Aws, stacks: list[Resource]) -> list[list[Resource]]:
    """Importers before exporters: wave 0 holds the stacks nobody (still present) imports from."""
    ids = {s.id for s in stacks}
    used_by = {s.id: set(s.detail.get("imported_by", ())) & ids for s in stacks}
    by_id = {s.id: s for s in stacks}
    order: list[list[Resource]] = []
    left = set(by_id)
    while left:
        wave = sorted(x for x in left if not (used_by[x] & left))
        if not wave:  # an import cycle cannot be deployed; delete the rest together and let AWS say why
            wave = sorted(left)
        order.append([by_id[x] for x in wave])
        left -= set(wave)
    return order


def stack_exists(aws: Aws, name: str) -> bool:
    try:
        stacks = aws.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
    except botocore.exceptions.ClientError as exc:
        if "does not exist" in error_message(exc):
            return False
        raise
    return bool(stacks) and stacks[0]["StackStatus"] not in GONE_STATUSES


def delete_stack(aws: Aws, r: Resource, scope: Scope) -> None:
    live = [name for name in r.detail.get("imported_by", ()) if stack_exists(aws, name)]
    if live:
        raise DeleteFailed(
            f"not attempted: its exports are still imported by {', '.join(live)} (AWS refuses); "
            "delete that stack first or remove its protection"
        )
    aws.client("cloudformation").delete_stack(StackName=r.detail["stack_id"])


def failure_reasons(aws: Aws, r: Resource, limit: int = 3) -> str:
    """The failed resources of the last delete attempt, newest first, from the stack events."""
    cfn = aws.client("cloudformation")
    reasons = []
    for page in cfn.get_paginator("describe_stack_events").paginate(StackName=r.detail["stack_id"]):
        for ev in page["StackEvents"]:
            if ev.get("ResourceStatus") == "DELETE_FAILED" and ev.get("LogicalResourceId") != r.id:
                reasons.append(
                    f"{ev['LogicalResourceId']} ({ev.get('ResourceType', '?')}): "
                    f"{ev.get('ResourceStatusReason', '')}"
                )
            if ev.get("ResourceStatus") == "DELETE_IN_PROGRESS" and ev.get("LogicalResourceId") == r.id:
                return "; ".join(reasons[:limit])  # the start of the last attempt
        if len(reasons) >= limit:
            break
    return "; ".join(reasons[:limit])


def stack_state(aws: Aws, r: Resource) -> tuple[State, str]:
    s = aws.client("cloudformation").describe_stacks(StackName=r.detail["stack_id"])["Stacks"][0]
    status = s["StackStatus"]
    if status in GONE_STATUSES:
        return "gone", ""
    if status == "DELETE_FAILED":
        why = failure_reasons(aws, r) or s.get("StackStatusReason", "")
        return "failed", f"DELETE_FAILED: {why}"
    if status == "DELETE_IN_PROGRESS" or status == r.detail["status"]:
        return "deleting", status
    # e.g. UPDATE_COMPLETE again when an export is still imported elsewhere (aws/aws-sdk#383)
    return "failed", f"{status}: {s.get('StackStatusReason', 'deletion did not start')}"


KIND = Kind(
    name="stack",
    title="CloudFormation stacks",
    list=list_stacks,
    delete=delete_stack,
    state=stack_state,
    waves=waves,
)
