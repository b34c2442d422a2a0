"""Static PersistentVolume and claim for the FSx file system.

As in kubernetes-sigs/aws-fsx-csi-driver `examples/kubernetes/static_provisioning`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from constructs import Construct, IConstruct

from fsdpkit.contracts.labels import MANAGED_BY, MANAGED_BY_LABEL

PV_PREFIX = "fsx-pv"
PVC_PREFIX = "fsx-claim"


def volume_names(references_digest: str) -> tuple[str, str]:
    """PV and PVC names, suffixed with the file system's replacement digest.

    A PV's volume source and a PVC's volumeName are immutable: when FSx is replaced, the new pair gets new
    names, and the kubectl provider's prune removes the old pair.
    """
    return f"{PV_PREFIX}-{references_digest}", f"{PVC_PREFIX}-{references_digest}"


def fsx_volume_manifests(
    *,
    file_system_id: str,
    dns_name: str,
    mount_name: str,
    storage_gib: int,
    namespace: str,
    references_digest: str,
) -> list[dict[str, Any]]:
    """The PV (Retain, ReadWriteMany, flock) and the PVC bound to it by name."""
    pv_name, pvc_name = volume_names(references_digest)
    size = f"{storage_gib}Gi"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": size},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "mountOptions": ["flock"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {
                "driver": "fsx.csi.aws.com",
                "volumeHandle": file_system_id,
                "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": size}},
            "volumeName": pv_name,
        },
    }
    return [pv, pvc]


class FsxVolume(Construct):
    """Applies the PV/PVC through the kubectl provider, after the FSx CSI driver add-on."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        file_system: fsx.LustreFileSystem,
        storage_gib: int,
        namespace: str,
        references_digest: str,
        after: Sequence[IConstruct] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        manifests = fsx_volume_manifests(
            file_system_id=file_system.file_system_id,
            dns_name=file_system.dns_name,
            mount_name=file_system.mount_name,
            storage_gib=storage_gib,
            namespace=namespace,
            references_digest=references_digest,
        )
        if namespace != "default":
            meta = {"name": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
            manifests.insert(0, {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        self.manifest = eks.KubernetesManifest(
            self, "Manifest", cluster=cluster, manifest=manifests, overwrite=True
        )
        for dependency in after:
            self.manifest.node.add_dependency(dependency)
