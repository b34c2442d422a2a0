"""EBS volumes the EBS CSI driver created for PVCs; a `Retain` reclaim policy makes them outlive the cluster.

Listed after the node groups are gone, so they are detached; `VolumeInUse` is retried with backoff. A volume
a user kept is data, deleted only with `--delete-data`: its PersistentVolume says `Retain`, its claim lives
outside the kit's namespaces, its cluster could not be read (the policy is unknown), or it carries
`kit:keep-data`. Teardown writes that tag, with the reason, before it deletes the volume's cluster
(fsdpkit.ops.teardown.adopt), so a rerun keeps the volume after the PersistentVolume is gone.
"""

from __future__ import annotations

from collections.abc import Mapping

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import CLUSTER_TAG, PROJECT_TAG, cluster_owner, tag_dict
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.model import Kind, Resource, Scope, State

PVC_TAG = "kubernetes.io/created-for/pvc/name"
KEEP_DATA_TAG = "kit:keep-data"
"""On an EBS volume: keep it unless --delete-data (any value; teardown writes one of KEEP_DATA_WHY's keys)."""
KEEP_DATA_WHY = {
    "pv-retain": "its PersistentVolume had reclaim policy Retain",
    "claim-outside-kit": "its claim was outside the kit's namespaces",
    "reclaim-policy-unknown": "its cluster could not be read, so its reclaim policy was unknown",
}


def owner_cluster(tags: Mapping[str, str], clusters: tuple[str, ...]) -> str | None:
    return next((c for c in clusters if cluster_owner(tags, (c,)) or tags.get(CLUSTER_TAG) == c), None)


def kept_data(volume_id: str, tags: Mapping[str, str], scope: Scope) -> tuple[str, str] | None:
    """(the `kit:keep-data` value, the reason) when a user kept this volume, else None."""
    if (code := tags.get(KEEP_DATA_TAG)) is not None:
        why = f" ({KEEP_DATA_WHY[code]})" if code in KEEP_DATA_WHY else ""
        return code, f"tagged {KEEP_DATA_TAG}={code}{why}"
    for cluster, facts in sorted(scope.kube.items()):
        pv = facts.volumes.get(volume_id)
        if pv is None:
            continue
        where = f"(cluster {cluster})"
        if pv.reclaim == "Retain":
            return "pv-retain", f"its PersistentVolume {pv.name} {where} has reclaim policy Retain"
        if pv.claim_namespace and pv.claim_namespace not in facts.namespaces:
            return "claim-outside-kit", f"its claim {pv.claim} {where} is outside the kit's namespaces"
        return None
    cluster = owner_cluster(tags, tuple(scope.kube_unread))
    if PVC_TAG in tags and cluster is not None:
        why = scope.kube_unread[cluster]
        return "reclaim-policy-unknown", f"the reclaim policy of its PersistentVolume is unknown ({why})"
    return None


def list_volumes(aws: Aws, scope: Scope) -> list[Resource]:
    ec2 = aws.client("ec2")
    keys = [PROJECT_TAG, PVC_TAG, "ebs.csi.aws.com/cluster", "KubernetesCluster"]
    keys += [f"kubernetes.io/cluster/{c}" for c in scope.owner_clusters]
    seen: dict[str, Resource] = {}
    for key in keys:  # one filter per key: an OR over several tag keys is not honoured everywhere (moto)
        for page in ec2.get_paginator("describe_volumes").paginate(
            Filters=[{"Name": "tag-key", "Values": [key]}]
        ):
            for v in page["Volumes"]:
                t = tag_dict(v.get("Tags"))
                if managed_by_stack(v["VolumeId"], t, scope.stack_resources) or v["VolumeId"] in seen:
                    continue
                detail = {"state": v["State"], "size_gib": v["Size"], "created": v.get("CreateTime")}
                if kept := kept_data(v["VolumeId"], t, scope):
                    code, why = kept
                    detail |= {"is_data": True, "keep_data": code, "data_reason": why}
                    detail["note"] = f"{why}; deleted because of --delete-data"
                r = Resource(
                    kind="ebs-volume",
                    id=v["VolumeId"],
                    name=t.get(PVC_TAG, t.get("Name", "")),
                    tags=t,
                    detail=detail,
                )
                if ownership(r, scope) is not None:
                    seen[r.id] = r
    found = sorted(seen.values(), key=lambda r: r.id)
    return found


def delete_volume(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ec2").delete_volume(VolumeId=r.id)


def volume_state(aws: Aws, r: Resource) -> tuple[State, str]:
    vols = aws.client("ec2").describe_volumes(Filters=[{"Name": "volume-id", "Values": [r.id]}])["Volumes"]
    if not vols or vols[0]["State"] == "deleted":
        return "gone", ""
    return "deleting", vols[0]["State"]


KIND = Kind(
    name="ebs-volume",
    title="EBS volumes from PVCs",
    list=list_volumes,
    delete=delete_volume,
    state=volume_state,
)
