"""Cluster stack: EKS, node groups, add-ons, optional Kubernetes objects, the kit's outputs (contract 2)."""

from __future__ import annotations

from aws_cdk import CfnOutput
from constructs import Construct

from infra import references
from infra.config import KitConfig
from infra.constructs.addons import ClusterAddons, NetworkingAddons
from infra.constructs.cluster import Cluster
from infra.constructs.device_plugins import DevicePlugins
from infra.constructs.fsx_volume import FsxVolume, volume_names
from infra.constructs.gpu_nodegroup import GPU_TAINT, GpuNodeGroup, gpu_node_labels_json
from infra.constructs.monitoring import TrainingMonitoring
from infra.constructs.network import Network
from infra.constructs.storage import Storage, allow_lustre_callbacks
from infra.instances import GPU_INSTANCES
from infra.stacks.base import KitStack

OUTPUT_KEYS = (
    "ClusterName",
    "Region",
    "FsxFileSystemId",
    "FsxDnsName",
    "FsxMountName",
    "FsxStorageGiB",
    "EcrRepositoryUri",
    "GpuNodeLabels",
    "GpuNodeTaint",
    "GpuInstanceType",
    "GpuNodeCount",
    "GpuMaxNodes",
    "GpusPerNode",
    "EfaDevicesPerNode",
    "KubernetesObjectsByCdk",
    "UpdateKubeconfigCommand",
    "ReferencesDigest",
)
"""Outputs of the cluster stack, always present; with kubernetes.deploy_objects also FsxPvcName and
FsxPvcNamespace."""


class ClusterStack(KitStack):
    """Everything that lives in or on the EKS cluster, plus the outputs `make train-job` reads."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: KitConfig,
        network: Network,
        storage: Storage,
        repository_uri: str,
    ) -> None:
        super().__init__(
            scope, construct_id, cfg=cfg, suffix="cluster", description="FSDP kit: EKS cluster and GPU nodes"
        )
        deploy_objects = cfg.kubernetes.deploy_objects
        file_system = storage.file_system
        efa_digest = references.digest(
            references.replacing_inputs(network.efa_security_group.node.default_child)
        )
        fsx_digest = references.digest(references.replacing_inputs(storage.cfn, storage.overrides))
        self.control_plane = Cluster(
            self,
            "Eks",
            cfg=cfg.cluster,
            name=cfg.prefix,
            vpc=network.vpc,
            with_kubectl=deploy_objects,
            instance_tags=self.kit_tags,
        )
        cluster = self.control_plane.cluster
        self.networking = NetworkingAddons(self, "NetworkingAddons", cluster=cluster)
        self.gpu = GpuNodeGroup(
            self,
            "Gpu",
            cfg=cfg.gpu,
            cluster=cluster,
            subnet=network.private_subnet_in(cfg.gpu.availability_zone),
            efa_security_group=network.efa_security_group,
            instance_tags=self.kit_tags,
            references_digest=efa_digest,
        )
        # The primary interface also carries the cluster security group: Lustre callbacks must be let in there
        # as well as on the EFA group (the FSx guide asks it of every client group).
        fsx_group = file_system.connections.security_groups[0]
        allow_lustre_callbacks(
            self,
            client_group_id=cluster.cluster_security_group_id,
            fsx_group_id=fsx_group.security_group_id,
            references_digest=references.digest(references.replacing_inputs(fsx_group.node.default_child)),
        )
        for nodegroup in (self.control_plane.system_nodegroup, self.gpu.nodegroup):
            for addon in self.networking.all:
                nodegroup.node.add_dependency(addon)
        self.addons = ClusterAddons(
            self,
            "Addons",
            cluster=cluster,
            system_nodes=self.control_plane.system_nodegroup,
            pod_identity_agent=self.networking.pod_identity_agent,
        )
        self.monitoring = (
            TrainingMonitoring(self, "Monitoring", cfg=cfg.monitoring, cluster_name=cfg.prefix)
            if cfg.monitoring.enabled
            else None
        )
        if deploy_objects:
            DevicePlugins(
                self,
                "DevicePlugins",
                cfg=cfg.kubernetes,
                cluster=cluster,
                after=[self.control_plane.system_nodegroup],
            )
            FsxVolume(
                self,
                "FsxVolume",
                cluster=cluster,
                file_system=file_system,
                storage_gib=cfg.storage.storage_gib,
                namespace=cfg.kubernetes.namespace,
                references_digest=fsx_digest,
                after=[self.addons.fsx_csi],
            )

        spec = GPU_INSTANCES[cfg.gpu.instance_type]
        outputs = {
            "ClusterName": (cluster.cluster_name, "EKS cluster name"),
            "Region": (cfg.region, "AWS region of the kit"),
            "FsxFileSystemId": (
                file_system.file_system_id,
                "FSx for Lustre file system id (PV volumeHandle)",
            ),
            "FsxDnsName": (file_system.dns_name, "FSx DNS name (PV volumeAttributes.dnsname)"),
            "FsxMountName": (file_system.mount_name, "FSx mount name (PV volumeAttributes.mountname)"),
            "FsxStorageGiB": (str(cfg.storage.storage_gib), "FSx capacity in GiB (PV/PVC size)"),
            "EcrRepositoryUri": (repository_uri, "ECR repository URI for the trainer image"),
            "GpuNodeLabels": (gpu_node_labels_json(), "GPU node labels, a JSON object"),
            "GpuNodeTaint": (GPU_TAINT, "GPU node taint, key=value:Effect"),
            "GpuInstanceType": (cfg.gpu.instance_type, "GPU instance type"),
            "GpuNodeCount": (str(cfg.gpu.effective_desired_nodes), "desired GPU nodes"),
            "GpuMaxNodes": (str(cfg.gpu.max_nodes), "most GPU nodes the node group may scale to"),
            "GpusPerNode": (str(spec.gpus), "nvidia.com/gpu per node"),
            "EfaDevicesPerNode": (str(spec.efa_devices), "vpc.amazonaws.com/efa per node"),
            "KubernetesObjectsByCdk": (
                "true" if deploy_objects else "false",
                "whether CDK installed the device plugins and the FSx PV/PVC",
            ),
            "UpdateKubeconfigCommand": (
                f"aws eks update-kubeconfig --region {cfg.region} --name {cfg.prefix}",
                "configure kubectl for the cluster",
            ),
            "ReferencesDigest": (
                f"efa-sg={efa_digest},fsx={fsx_digest}",
                "digests of the referenced EFA group and FSx; a replacement there redeploys this stack",
            ),
        }
        if deploy_objects:
            outputs["FsxPvcName"] = (volume_names(fsx_digest)[1], "PVC bound to the FSx PV")
            outputs["FsxPvcNamespace"] = (cfg.kubernetes.namespace, "namespace of the FSx PVC")
        for key, (value, description) in outputs.items():
            CfnOutput(self, key, value=value, description=description)
