"""Shared filters: every kind decides delete/keep the same way, and exclude beats include.

`plan(resources, filters)` runs every filter on every resource; the first filter that says "keep" wins and its
reason is printed. A resource is deleted only when it is owned (`ownership`) and no filter keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fsdpkit.ops.tags import KEEP_TAG, KEEP_VALUE, PROJECT_TAG, cluster_owner
from fsdpkit.ops.teardown.model import Decision, Resource, Scope

Filter = Callable[[Resource, Scope], str | None]
"""Returns a reason to keep the resource, or None to let it through."""

CNI_ENI_TAGS = ("node.k8s.amazonaws.com/instance_id", "node.k8s.amazonaws.com/createdAt")
CSI_FSX_TAG = "CSIVolumeName"


def ownership(resource: Resource, scope: Scope) -> str | None:
    """The evidence that the kit owns this resource, or None. Never "everything in the account".

    1. the kit tag `kit:project=<prefix>` (everything CloudFormation created), or being a resource of a kit
       stack (its physical id, should a tag be missing);
    2. the owner tag a kit cluster's controller wrote (LB controller, EBS CSI, VPC CNI, EKS); for a former
       kit cluster, only on what was made before the kit stack naming it was deleted (`made_before_gone`);
    3. VPC CNI ENIs (their node tag) and FSx CSI file systems (`CSIVolumeName`) inside a kit VPC;
    4. Kubernetes objects inside a kit cluster (the cluster is about to be deleted);
    5. the control-plane / Container Insights log groups AWS creates, untagged, for a kit cluster.
    """
    tags = resource.tags
    if tags.get(PROJECT_TAG) == scope.prefix:
        return f"{PROJECT_TAG}={scope.prefix}"
    if resource.id in scope.stack_resources:
        return "a resource of a kit stack"
    owner = cluster_owner(tags, scope.clusters) or former_owner(resource, scope)
    if owner:
        return owner
    if in_kit_vpc(resource, scope):
        for key in CNI_ENI_TAGS:
            if key in tags:
                return f"VPC CNI tag {key} in kit VPC"
        if CSI_FSX_TAG in tags:
            return f"FSx CSI tag {CSI_FSX_TAG} in kit VPC"
    k8s_cluster = resource.detail.get("k8s_cluster")
    if k8s_cluster and k8s_cluster in scope.clusters:
        return f"object in kit cluster {k8s_cluster}"
    of = resource.detail.get("log_group_of")
    if of and (
        of in scope.clusters or (of in scope.former_clusters and made_before_gone(resource, scope, of))
    ):
        return f"log group of kit cluster {of}"
    return None


def in_kit_vpc(resource: Resource, scope: Scope) -> bool:
    vpc = resource.detail.get("vpc_id")
    subnets = set(resource.detail.get("subnet_ids", ()))
    return (vpc is not None and vpc in scope.vpcs) or bool(subnets & set(scope.subnets))


def former_owner(resource: Resource, scope: Scope) -> str | None:
    """A former kit cluster's owner tag, when the resource was made while that cluster was the kit's."""
    for c in scope.former_clusters:
        evidence = cluster_owner(resource.tags, (c,))
        if evidence and made_before_gone(resource, scope, c):
            return evidence
    return None


def made_before_gone(resource: Resource, scope: Scope, cluster: str) -> bool:
    """A name is kit evidence only up to the deletion of the kit stack that named it: a later cluster of
    that name (not the kit's, deleted again within CloudFormation's 90 days) made its resources after.
    Without a creation time (target and security groups, ENIs) the resource must sit in a kit VPC."""
    gone = scope.former_deleted_at.get(cluster)
    if gone is None:
        return True
    created = resource.detail.get("created")
    return created < gone if created is not None else in_kit_vpc(resource, scope)


def not_owned(resource: Resource, scope: Scope) -> str | None:
    if ownership(resource, scope) is None:
        return f"not owned: no {PROJECT_TAG}={scope.prefix} tag and no kit cluster's owner tag"
    return None


def protection_tag(resource: Resource, scope: Scope) -> str | None:
    if resource.tags.get(KEEP_TAG) == KEEP_VALUE:
        return f"protected by tag {KEEP_TAG}={KEEP_VALUE}"
    return None


def protected(resource: Resource, scope: Scope) -> str | None:
    """Deletion / termination protection set in AWS: respected, never switched off by teardown."""
    reason = resource.detail.get("protected")
    return str(reason) if reason else None


def kind_keeps(resource: Resource, scope: Scope) -> str | None:
    """A reason the resource's kind gives for leaving it (no deleter, it goes with its group, ...)."""
    reason = resource.detail.get("keep_reason")
    return str(reason) if reason else None


def data_kept(resource: Resource, scope: Scope) -> str | None:
    if resource.detail.get("is_data") and not scope.options.delete_data:
        if why := resource.detail.get("data_reason"):
            return f"{why}: kept as data; pass --delete-data to delete it"
        return "data is kept by default; pass --delete-data to empty and delete it"
    return None


DEFAULT_FILTERS: tuple[Filter, ...] = (not_owned, protection_tag, protected, kind_keeps, data_kept)
"""Order matters only for the printed reason: ownership first, then the user's and AWS's protections."""


def plan(
    resources: Iterable[Resource], scope: Scope, filters: Iterable[Filter] = DEFAULT_FILTERS
) -> list[Decision]:
    """A decision for every resource; none is dropped silently."""
    chain = tuple(filters)
    decisions = []
    for r in resources:
        keep = next((reason for f in chain if (reason := f(r, scope))), None)
        if keep:
            decisions.append(Decision(resource=r, action="keep", reason=keep))
        else:
            note = r.detail.get("note")
            reason = str(ownership(r, scope)) + (f"; {note}" if note else "")
            decisions.append(Decision(resource=r, action="delete", reason=reason))
    return decisions
