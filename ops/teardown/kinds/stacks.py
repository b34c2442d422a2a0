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

from ops.aws import Aws
from ops.tags import PROJECT_TAG, tag_dict
from ops.teardown.model import Kind, Resource, Scope, State

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
            detail: dict[str, Any] = {
                "stack_id": s["StackId"],
                "status": s["StackStatus"],
                "exports": tuple(o["ExportName"] for o in s.get("Outputs", []) if o.get("ExportName")),
            }
            if s.get("EnableTerminationProtection"):
                detail["protected"] = "termination protection is on; turn it off yourself if you mean it"
            found.append(
                Resource(kind="stack", id=s["StackName"], name=s["StackName"], tags=tags, detail=detail)
            )
    return found


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
    exporter = {e: s.id for s in stacks for e in s.detail["exports"]}
    needs = {s.id: {exporter[i] for i in imported_exports(aws, s) if i in exporter} - {s.id} for s in stacks}
    # used_by[x] = stacks that import from x; x may go once they are all gone.
    used_by = {s.id: {o for o, deps in needs.items() if s.id in deps} for s in stacks}
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


def delete_stack(aws: Aws, r: Resource, scope: Scope) -> None:
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
