"""EKS managed node groups of the kit's clusters: they must go before the cluster (ResourceInUseException)."""

from __future__ import annotations

from ops.aws import Aws
from ops.teardown.model import Kind, Resource, Scope, State


def list_nodegroups(aws: Aws, scope: Scope) -> list[Resource]:
    eks = aws.client("eks")
    found = []
    for cluster in scope.clusters:
        for page in eks.get_paginator("list_nodegroups").paginate(clusterName=cluster):
            for name in page["nodegroups"]:
                ng = eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
                found.append(
                    Resource(
                        kind="nodegroup",
                        id=f"{cluster}/{name}",
                        name=name,
                        tags=ng.get("tags") or {},
                        detail={"cluster": cluster, "nodegroup": name, "status": ng.get("status")},
                    )
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
