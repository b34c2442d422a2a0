"""EKS managed node groups of the kit's clusters: they must go before the cluster (ResourceInUseException).

A kit-tagged node group in a cluster that is not the kit's is listed too, as kept: every kit-tagged
resource is in the plan, but teardown does not delete from other clusters. The tagging API does not list
node groups, so the other clusters' groups are described for their tags.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG
from fsdpkit.ops.teardown.model import Kind, Resource, Scope, State


def list_nodegroups(aws: Aws, scope: Scope) -> list[Resource]:
    eks = aws.client("eks")
    found = []
    clusters = [c for page in eks.get_paginator("list_clusters").paginate() for c in page["clusters"]]
    for cluster in sorted(set(clusters) | set(scope.clusters)):
        kit_cluster = cluster in scope.clusters
        try:
            pages = list(eks.get_paginator("list_nodegroups").paginate(clusterName=cluster))
        except eks.exceptions.ResourceNotFoundException:
            continue  # deleted since it was listed
        for name in (n for page in pages for n in page["nodegroups"]):
            ng = eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
            tags = ng.get("tags") or {}
            detail: dict[str, object] = {"cluster": cluster, "nodegroup": name, "status": ng.get("status")}
            if not kit_cluster:
                if tags.get(PROJECT_TAG) != scope.prefix:
                    continue
                detail["keep_reason"] = (
                    f"in cluster {cluster}, which is not the kit's: teardown does not delete from other "
                    "clusters; delete it yourself if it is the kit's"
                )
            found.append(
                Resource(kind="nodegroup", id=f"{cluster}/{name}", name=name, tags=tags, detail=detail)
            )
    return found


def delete_nodegroup(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("eks").delete_nodegroup(clusterName=r.detail["cluster"], nodegroupName=r.detail["nodegroup"])


def nodegroup_state(aws: Aws, r: Resource) -> tuple[State, str]:
    ng = aws.client("eks").describe_nodegroup(
        clusterName=r.detail["cluster"], nodegroupName=r.detail["nodegroup"]
    )
    ng = ng["nodegroup"]
    if ng.get("status") == "DELETE_FAILED":
        issues = "; ".join(i.get("message", "") for i in ng.get("health", {}).get("issues", []))
        return "failed", f"DELETE_FAILED: {issues or 'see the EKS console'}"
    return "deleting", str(ng.get("status"))


KIND = Kind(
    name="nodegroup",
    title="EKS node groups",
    list=list_nodegroups,
    delete=delete_nodegroup,
    state=nodegroup_state,
)
