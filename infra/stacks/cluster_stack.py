"""Cluster stack: EKS, node groups, add-ons, optional Kubernetes objects, the kit's outputs (contract 2)."""

from __future__ import annotations

from aws_cdk import CfnOutput
from aws_cdk import aws_fsx as fsx
from constructs import Construct

from fsdpkit.infra import references
from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.constructs.addons import ClusterAddons, NetworkingAddons
from fsdpkit.infra.constructs.cluster import Cluster
from fsdpkit.infra.constructs.device_plugins import DevicePlugins
from fsdpkit.infra.constructs.fsx_volume import FsxVolume, volume_names
from fsdpkit.infra.constructs.gpu_nodegroup import GPU_TAINT, GpuNodeGroup, gpu_node_labels_json
from fsdpkit.infra.constructs.job_controllers import JobControllers
from fsdpkit.infra.constructs.monitoring import TrainingMonitoring
from fsdpkit.infra.constructs.network import Network
from fsdpkit.infra.constructs.storage import Storage, allow_lustre_callbacks
from fsdpkit.infra.instances import GPU_INSTANCES
from fsdpkit.infra.stacks.base import KitStack

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
        efa_digest = references.digest(
            references.replacing_inputs(network.efa_security_group.node.default_child)
        )
        fsx_digest = references.digest(references.replacing_inputs(storage.cfn, storage.overrides))
        self._add_nodes(cfg, network=network, efa_digest=efa_digest)
        self._let_fsx_reach_nodes(storage.file_system)
        self._add_addons(cfg)
        if cfg.kubernetes.deploy_objects:
            self._add_kubernetes_objects(cfg, file_system=storage.file_system, fsx_digest=fsx_digest)
        for key, (value, description) in self._outputs(
            cfg,
            file_system=storage.file_system,
            repository_uri=repository_uri,
            efa_digest=efa_digest,
            fsx_digest=fsx_digest,
        ).items():
            CfnOutput(self, key, value=value, description=description)

    def _add_nodes(self, cfg: KitConfig, *, network: Network, efa_digest: str) -> None:
        """The control plane with its system nodes, the GPU nodes, and the networking add-ons both need."""
        self.control_plane = Cluster(
            self,
            "Eks",
            cfg=cfg.cluster,
            name=cfg.prefix,
            vpc=network.vpc,
            with_kubectl=cfg.kubernetes.deploy_objects,
            instance_tags=self.kit_tags,
        )
        self.networking = NetworkingAddons(self, "NetworkingAddons", cluster=self.control_plane.cluster)
        self.gpu = GpuNodeGroup(
            self,
            "Gpu",
            cfg=cfg.gpu,
            cluster=self.control_plane.cluster,
            subnet=network.private_subnet_in(cfg.gpu.availability_zone),
            efa_security_group=network.efa_security_group,
            instance_tags=self.kit_tags,
            references_digest=efa_digest,
        )
        # The networking add-ons are DaemonSets a node needs before it is Ready.
        for nodegroup in (self.control_plane.system_nodegroup, self.gpu.nodegroup):
            for addon in self.networking.all:
                nodegroup.node.add_dependency(addon)

    def _let_fsx_reach_nodes(self, file_system: fsx.LustreFileSystem) -> None:
        """Lustre callbacks into the cluster security group too: the nodes' primary interfaces carry it
        besides the EFA group, and the FSx guide asks it of every client group."""
        fsx_group = file_system.connections.security_groups[0]
        allow_lustre_callbacks(
            self,
            client_group_id=self.control_plane.cluster.cluster_security_group_id,
            fsx_group_id=fsx_group.security_group_id,
            references_digest=references.digest(references.replacing_inputs(fsx_group.node.default_child)),
        )

    def _add_addons(self, cfg: KitConfig) -> None:
        """The cluster add-ons on the system nodes, and the training dashboard and alarms when enabled."""
        self.addons = ClusterAddons(
            self,
            "Addons",
            cluster=self.control_plane.cluster,
            system_nodes=self.control_plane.system_nodegroup,
            pod_identity_agent=self.networking.pod_identity_agent,
        )
        self.monitoring = (
            TrainingMonitoring(self, "Monitoring", cfg=cfg.monitoring, cluster_name=cfg.prefix)
            if cfg.monitoring.enabled
            else None
        )

    def _add_kubernetes_objects(
        self, cfg: KitConfig, *, file_system: fsx.LustreFileSystem, fsx_digest: str
    ) -> None:
        """The device plugins and the FSx PV/PVC (kubernetes.deploy_objects), and the JobSet and Trainer
        controllers (kubernetes.job_controllers)."""
        cluster = self.control_plane.cluster
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
        if cfg.kubernetes.job_controllers:
            JobControllers(
                self,
                "JobControllers",
                cfg=cfg.kubernetes,
                cluster=cluster,
                after=[self.control_plane.system_nodegroup],
            )

    def _outputs(
        self,
        cfg: KitConfig,
        *,
        file_system: fsx.LustreFileSystem,
        repository_uri: str,
        efa_digest: str,
        fsx_digest: str,
    ) -> dict[str, tuple[str, str]]:
        """OUTPUT_KEYS (and the PVC's with Kubernetes objects): key -> (value, description)."""
        deploy_objects = cfg.kubernetes.deploy_objects
        spec = GPU_INSTANCES[cfg.gpu.instance_type]
        outputs = {
            "ClusterName": (self.control_plane.cluster.cluster_name, "EKS cluster name"),
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
        return outputs
