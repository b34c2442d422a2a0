"""NVIDIA and EFA device plugins (Helm charts, pinned): the AL2023 NVIDIA AMI ships drivers, not plugins."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IConstruct

from fsdpkit.infra.config import KubernetesConfig
from fsdpkit.infra.constructs.gpu_nodegroup import GPU_NODE_LABELS, GPU_TAINT_EFFECT, GPU_TAINT_KEY
from fsdpkit.infra.eks_images import efa_plugin_repository

NVIDIA_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
EFA_REPOSITORY = "https://aws.github.io/eks-charts"
PLUGIN_NAMESPACE = "kube-system"
EFA_LABEL = "vpc.amazonaws.com/efa.present"

_GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


def nvidia_values() -> dict[str, object]:
    """NVIDIA device plugin values: GPU nodes only, GDRCopy on, MOFED off.

    GDRCopy: NCCL over EFA uses it for small messages; the chart's default was reverted to off in v0.19.3.
    MOFED: EFA nodes have no Mellanox OFED stack, so the plugin must not look for it.
    """
    return {
        "tolerations": [_GPU_TOLERATION],
        "nodeSelector": {"nvidia.com/gpu.present": GPU_NODE_LABELS["nvidia.com/gpu.present"]},
        "gdrcopyEnabled": True,
        "mofedEnabled": False,
    }


def efa_values(region: str) -> dict[str, object]:
    """EFA device plugin values: the kit's EFA label selects the nodes; the image comes from `region`."""
    return {
        "image": {"repository": efa_plugin_repository(region)},
        "tolerations": [_GPU_TOLERATION],
        "nodeSelector": {EFA_LABEL: GPU_NODE_LABELS[EFA_LABEL]},
        "supportedInstanceLabels": {"keys": [EFA_LABEL], "values": [GPU_NODE_LABELS[EFA_LABEL]]},
    }


class DevicePlugins(Construct):
    """Advertise `nvidia.com/gpu` and `vpc.amazonaws.com/efa` on the GPU nodes.

    The EFA plugin selects nodes by the kit's own label instead of the chart's instance-type allowlist:
    an allowlist that misses a type silently schedules no plugin, and NCCL falls back to TCP.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: KubernetesConfig,
        cluster: eks.Cluster,
        after: Sequence[IConstruct] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self.nvidia = eks.HelmChart(
            self,
            "Nvidia",
            cluster=cluster,
            chart="nvidia-device-plugin",
            repository=NVIDIA_REPOSITORY,
            version=cfg.nvidia_device_plugin_version,
            release="nvidia-device-plugin",
            namespace=PLUGIN_NAMESPACE,
            create_namespace=False,
            values=nvidia_values(),
        )
        self.efa = eks.HelmChart(
            self,
            "Efa",
            cluster=cluster,
            chart="aws-efa-k8s-device-plugin",
            repository=EFA_REPOSITORY,
            version=cfg.efa_device_plugin_version,
            release="aws-efa-k8s-device-plugin",
            namespace=PLUGIN_NAMESPACE,
            create_namespace=False,
            values=efa_values(Stack.of(self).region),
        )
        for dependency in after:
            self.nvidia.node.add_dependency(dependency)
            self.efa.node.add_dependency(dependency)
