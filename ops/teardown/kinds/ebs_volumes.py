"""EBS volumes the EBS CSI driver created for PVCs; a `Retain` reclaim policy makes them outlive the cluster.

Listed after the node groups are gone, so they are detached; `VolumeInUse` is retried with backoff.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG, tag_dict
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import managed_by_stack
from fsdpkit.ops.teardown.model import Kind, Resource, Scope, State

PVC_TAG = "kubernetes.io/created-for/pvc/name"


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
                r = Resource(
                    kind="ebs-volume",
                    id=v["VolumeId"],
                    name=t.get(PVC_TAG, t.get("Name", "")),
                    tags=t,
                    detail={"state": v["State"], "size_gib": v["Size"], "created": v.get("CreateTime")},
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
