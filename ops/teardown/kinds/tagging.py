"""The Resource Groups Tagging API: every resource of this region that carries `kit:project=<prefix>`.

It is regional, but S3 answers with buckets of every region (callers check a bucket's own region), and it
misses ECR repositories, EKS clusters and node groups (their kinds list them per service instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG
from fsdpkit.ops.teardown.model import Scope

NAME_ONLY_TYPES = {"sns": "topic", "sqs": "queue"}
"""Services whose ARNs end in the bare name, without a resource type."""
ELBV2_KINDS = ("app/", "net/", "gwy/")
"""ELBv2 load balancer ARNs say which kind; a classic ELB's ARN is `loadbalancer/<name>`."""


@dataclass(frozen=True)
class TaggedArn:
    arn: str
    type: str
    """`service:resource-type`, e.g. `ec2:vpc`, `s3:bucket`, `logs:log-group`."""
    id: str
    """What the service's own API calls it: `vpc-1`, the bucket or log group name; the ARN for ELB."""
    tags: dict[str, str]


def parse_arn(arn: str) -> tuple[str, str]:
    """(`service:type`, id) of an ARN: `arn:aws:ec2:r:a:vpc/vpc-1` -> (`ec2:vpc`, `vpc-1`)."""
    parts = arn.split(":", 5)
    service, resource = parts[2], parts[5] if len(parts) > 5 else ""
    if service == "s3":
        return "s3:bucket", resource
    if service == "logs" and resource.startswith("log-group:"):
        return "logs:log-group", resource.removeprefix("log-group:").removesuffix(":*")
    if "/" not in resource and ":" not in resource:  # `arn:aws:sns:r:a:my-topic`: the name alone
        return f"{service}:{NAME_ONLY_TYPES.get(service, 'resource')}", arn
    sep = "/" if "/" in resource else ":"
    rtype, _, rid = resource.partition(sep)
    if service == "elasticloadbalancing" and rtype == "loadbalancer" and not rid.startswith(ELBV2_KINDS):
        rtype = "classic-loadbalancer"  # the in-tree provider's; the ELBv2 API does not list it
    if service in ("elasticloadbalancing", "cloudformation") or not rid:
        rid = arn
    elif service == "eks" and rtype == "nodegroup":
        rid = "/".join(rid.split("/")[:2])
    return f"{service}:{rtype}", rid


def tagged(aws: Aws, scope: Scope, resource_types: tuple[str, ...] = ()) -> list[TaggedArn]:
    """Everything tagged kit:project=<prefix> (of the given types; all types when empty)."""
    # The types are filtered here from the ARNs, not with ResourceTypeFilters: endpoints disagree on the
    # filter's spelling (moto returns nothing for `logs:log-group`), and one call answers every kind.
    pages = (
        aws.client("resourcegroupstaggingapi")
        .get_paginator("get_resources")
        .paginate(TagFilters=[{"Key": PROJECT_TAG, "Values": [scope.prefix]}])
    )
    found = []
    for page in pages:
        for m in page["ResourceTagMappingList"]:
            rtype, rid = parse_arn(m["ResourceARN"])
            if resource_types and rtype not in resource_types:
                continue
            tags = {t["Key"]: t["Value"] for t in m.get("Tags", [])}
            found.append(TaggedArn(arn=m["ResourceARN"], type=rtype, id=rid, tags=tags))
    return found
