"""CloudWatch log groups: kit-tagged ones, and those AWS creates untagged for a kit cluster.

After the cluster: the control plane recreates `/aws/eks/<cluster>/cluster` while it still logs (pitfall 10).
Tagged groups are found through the Resource Groups Tagging API (one call per page instead of one per group).
"""

from __future__ import annotations

from ops.aws import Aws
from ops.tags import PROJECT_TAG
from ops.teardown.model import Kind, Resource, Scope

CLUSTER_LOG_PREFIXES = ("/aws/eks/{c}/", "/aws/containerinsights/{c}/")


def tagged_arns(aws: Aws, scope: Scope, resource_type: str) -> dict[str, dict[str, str]]:
    """ARN -> tags of resources of one type tagged kit:project=<prefix> (tagging API)."""
    tagging = aws.client("resourcegroupstaggingapi")
    pages = tagging.get_paginator("get_resources").paginate(
        TagFilters=[{"Key": PROJECT_TAG, "Values": [scope.prefix]}], ResourceTypeFilters=[resource_type]
    )
    return {
        m["ResourceARN"]: {t["Key"]: t["Value"] for t in m.get("Tags", [])}
        for page in pages
        for m in page["ResourceTagMappingList"]
    }


def list_log_groups(aws: Aws, scope: Scope) -> list[Resource]:
    found: dict[str, Resource] = {}
    for arn, tags in tagged_arns(aws, scope, "logs:log-group").items():
        name = arn.split(":log-group:", 1)[1].removesuffix(":*")
        found[name] = Resource(kind="log-group", id=name, name=name, tags=tags, detail={})
    logs = aws.client("logs")
    for cluster in scope.clusters:
        for pattern in CLUSTER_LOG_PREFIXES:
            prefix = pattern.format(c=cluster)
            for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
                for g in page["logGroups"]:
                    name = g["logGroupName"]
                    if name not in found:
                        tags = logs.list_tags_for_resource(resourceArn=g["logGroupArn"]).get("tags", {})
                        found[name] = Resource(
                            kind="log-group", id=name, name=name, tags=tags, detail={"log_group_of": cluster}
                        )
    return sorted(found.values(), key=lambda r: r.id)


def delete_log_group(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("logs").delete_log_group(logGroupName=r.id)


KIND = Kind(name="log-group", title="Log groups", list=list_log_groups, delete=delete_log_group)
