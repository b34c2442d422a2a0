"""The kit's EKS clusters, after their node groups; control-plane logging stops with them."""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.teardown.adopt import adopt
from fsdpkit.ops.teardown.model import DeleteFailed, Kind, Resource, Scope, State


def list_clusters(aws: Aws, scope: Scope) -> list[Resource]:
    eks = aws.client("eks")
    found = []
    for name in scope.clusters:
        try:
            c = eks.describe_cluster(name=name)["cluster"]
        except eks.exceptions.ResourceNotFoundException:
            continue
        found.append(Resource(kind="cluster", id=name, name=name, tags=c.get("tags") or {}, detail={}))
    return found


def delete_cluster(aws: Aws, r: Resource, scope: Scope) -> None:
    eks = aws.client("eks")
    left = eks.list_nodegroups(clusterName=r.id)["nodegroups"]
    if left:
        # A kept (untagged / protected) node group blocks the cluster for good: say so instead of waiting.
        raise DeleteFailed(f"node groups still attached: {', '.join(left)}; delete or tag them, then rerun")
    eks.delete_cluster(name=r.id)


def cluster_state(aws: Aws, r: Resource) -> tuple[State, str]:
    c = aws.client("eks").describe_cluster(name=r.id)["cluster"]
    if c.get("status") == "FAILED":
        return "failed", "cluster status FAILED; see the EKS console"
    return "deleting", str(c.get("status"))


KIND = Kind(
    name="cluster",
    title="EKS clusters",
    list=list_clusters,
    delete=delete_cluster,
    state=cluster_state,
    prepare=adopt,
)
