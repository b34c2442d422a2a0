"""Before a kit cluster is deleted, put the kit's tag on what its controllers made, so ownership survives it.

Controller-made resources (load balancers, target groups, security groups, EBS volumes, ENIs) name their
cluster in the controllers' tags (`elbv2.k8s.aws/cluster`, `kubernetes.io/cluster/<c>=owned`, ...), but
whether that cluster was the kit's is known only while the cluster exists. A first run that keeps one of
them (deletion protection, an error) deletes the cluster anyway; without this record the rerun could no
longer tell the leftover is the kit's. So, right before the cluster goes (its nodes, and with them the
controllers, are gone by then), each such resource gets `kit:project=<prefix>` and `kit:cluster=<c>`.
When that tagging fails (AccessDenied, TooManyTags), the cluster is kept: deleting it would leave its
controllers' resources unclaimable, and teardown could never converge; a rerun tries again.

Likewise, an EBS volume kept as data because of what the cluster says (its PersistentVolume's `Retain`, a
claim outside the kit's namespaces, an unreadable cluster) gets `kit:keep-data=<why>`: once the cluster is
gone, only the volume's own tag still says a user kept it.
"""

from __future__ import annotations

import botocore.exceptions

from fsdpkit.ops.aws import Aws, describe_error
from fsdpkit.ops.tags import CLUSTER_TAG, PROJECT_TAG, cluster_owner
from fsdpkit.ops.teardown.kinds import ebs_volumes, enis, load_balancers, security_groups, target_groups
from fsdpkit.ops.teardown.kinds.ebs_volumes import KEEP_DATA_TAG, owner_cluster
from fsdpkit.ops.teardown.model import Prepared, Resource, Scope

ELB_TAG_BATCH = 20
"""add_tags takes at most 20 ARNs; create_tags accepts many more ids."""

CONTROLLER_KINDS = (load_balancers, target_groups, security_groups, ebs_volumes, enis)


def controller_resources(aws: Aws, scope: Scope, clusters: set[str]) -> list[tuple[Resource, str]]:
    """(resource, cluster) for each resource a controller of one of `clusters` made, not kit-tagged yet."""
    found = []
    for module in CONTROLLER_KINDS:
        for r in module.KIND.list(aws, scope):
            if r.tags.get(PROJECT_TAG) == scope.prefix:
                continue
            owner = next((c for c in sorted(clusters) if cluster_owner(r.tags, (c,)) is not None), None)
            if owner is not None:
                found.append((r, owner))
    return found


def kept_volumes(aws: Aws, scope: Scope, clusters: set[str]) -> list[tuple[Resource, str]]:
    """(volume, cluster) for each EBS volume of `clusters` kept as data whose reason is not on it as a tag
    (none with --delete-data: this run deletes them)."""
    found: list[tuple[Resource, str]] = []
    if scope.options.delete_data:
        return found
    for r in ebs_volumes.KIND.list(aws, scope):
        if r.detail.get("keep_data") and KEEP_DATA_TAG not in r.tags:
            owner = owner_cluster(r.tags, tuple(sorted(clusters)))
            if owner is not None:
                found.append((r, owner))
    return found


def _tag(aws: Aws, scope: Scope, cluster: str, items: list[Resource], data: list[Resource]) -> None:
    """The kit's tags on the cluster's controller resources, the keep-data reason on its kept volumes."""
    tags = [{"Key": PROJECT_TAG, "Value": scope.prefix}, {"Key": CLUSTER_TAG, "Value": cluster}]
    elb = [r.id for r in items if r.kind in ("load-balancer", "target-group")]
    ec2 = [r.id for r in items if r.kind not in ("load-balancer", "target-group")]
    for i in range(0, len(elb), ELB_TAG_BATCH):
        aws.client("elbv2").add_tags(ResourceArns=elb[i : i + ELB_TAG_BATCH], Tags=tags)
    if ec2:
        aws.client("ec2").create_tags(Resources=ec2, Tags=tags)
    for code in sorted({r.detail["keep_data"] for r in data}):
        ids = [r.id for r in data if r.detail["keep_data"] == code]
        aws.client("ec2").create_tags(Resources=ids, Tags=[{"Key": KEEP_DATA_TAG, "Value": code}])


def adopt(aws: Aws, doomed: list[Resource], scope: Scope) -> Prepared:
    """Tag the doomed clusters' controller resources with the kit's tag, and their kept volumes with the
    reason; a cluster whose resources could not be tagged is kept (with the reason)."""
    clusters = {r.id for r in doomed}
    made = controller_resources(aws, scope, clusters)
    data = kept_volumes(aws, scope, clusters)
    notes = []
    keep: dict[str, str] = {}
    for cluster in sorted(clusters):
        items = [r for r, c in made if c == cluster]
        kept = [r for r, c in data if c == cluster]
        if not items and not kept:
            continue
        try:
            _tag(aws, scope, cluster, items, kept)
        except botocore.exceptions.ClientError as exc:
            keep[cluster] = (
                f"could not tag its {len(items) + len(kept)} controller resource(s) and kept volume(s) "
                f"({describe_error(exc)}): kept, so a rerun can still claim them and knows what a user kept; "
                "allow the tagging (elasticloadbalancing:AddTags, ec2:CreateTags) and rerun"
            )
            continue
        if items:
            notes.append(
                f"tagged {len(items)} controller resource(s) of {cluster} with {PROJECT_TAG}={scope.prefix} "
                "so a rerun finds them after the cluster is gone"
            )
        if kept:
            notes.append(
                f"tagged {len(kept)} kept EBS volume(s) of {cluster} with {KEEP_DATA_TAG}=<why> so a rerun "
                "keeps them after the cluster is gone"
            )
    return Prepared(notes=notes, keep=keep)
