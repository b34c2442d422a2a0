"""CloudWatch log groups: kit-tagged ones, and those AWS creates untagged for a kit cluster.

After the cluster: the control plane recreates `/aws/eks/<cluster>/cluster` while it still logs (pitfall 10).
Tagged groups come from the Resource Groups Tagging API plus a sweep of names holding the prefix or a kit
cluster (tags fetched only for those, not for every group in the account).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.teardown.kinds.tagging import tagged
from fsdpkit.ops.teardown.model import Kind, Resource, Scope

CLUSTER_LOG_PREFIXES = ("/aws/eks/{c}/", "/aws/containerinsights/{c}/")


def list_log_groups(aws: Aws, scope: Scope) -> list[Resource]:
    found: dict[str, Resource] = {}
    for t in tagged(aws, scope, ("logs:log-group",)):
        found[t.id] = Resource(kind="log-group", id=t.id, name=t.id, tags=t.tags, detail={})
    logs = aws.client("logs")
    # The tagging API is the fast path on AWS; a name sweep adds the groups that carry the prefix or a kit
    # cluster in their name (CDK names them after the stack) for endpoints whose tagging API misses logs.
    clusters = scope.owner_clusters
    needles = [scope.prefix.lower(), *(c.lower() for c in clusters)]
    for page in logs.get_paginator("describe_log_groups").paginate():
        for g in page["logGroups"]:
            name = g["logGroupName"]
            if name in found or not any(n in name.lower() for n in needles):
                continue
            owner = next(
                (c for c in clusters for p in CLUSTER_LOG_PREFIXES if name.startswith(p.format(c=c))), None
            )
            tags = logs.list_tags_for_resource(resourceArn=g["logGroupArn"]).get("tags", {})
            detail: dict[str, object] = {"log_group_of": owner} if owner else {}
            if "creationTime" in g:  # milliseconds since the epoch
                detail["created"] = datetime.fromtimestamp(g["creationTime"] / 1000, tz=UTC)
            found[name] = Resource(kind="log-group", id=name, name=name, tags=tags, detail=detail)
    return sorted(found.values(), key=lambda r: r.id)


def delete_log_group(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("logs").delete_log_group(logGroupName=r.id)


KIND = Kind(name="log-group", title="Log groups", list=list_log_groups, delete=delete_log_group)
