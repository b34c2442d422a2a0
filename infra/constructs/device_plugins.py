"""NVIDIA and EFA device plugins (Helm charts, pinned): the AL2023 NVIDIA AMI ships drivers, not plugins."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IConstruct

from infra.config import KubernetesConfig
from infra.constructs.gpu_nodegroup import GPU_NODE_LABELS, GPU_TAINT_EFFECT, GPU_TAINT_KEY

NVIDIA_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
EFA_REPOSITORY = "https://aws.github.io/eks-charts"
PLUGIN_NAMESPACE = "kube-system"
EFA_LABEL = "vpc.amazonaws.com/efa.present"

_GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}

EKS_IMAGE_ACCOUNTS: dict[str, str] = {
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "ap-south-2": "900889452093",
    "ap-southeast-3": "296578399912",
    "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707",
    "ap-southeast-7": "121268973566",
    "ca-west-1": "761377655185",
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
    "eu-central-2": "900612956339",
    "eu-south-1": "590381155156",
    "eu-south-2": "455263428931",
    "il-central-1": "066635153087",
    "me-central-1": "759879836304",
    "me-south-1": "558608220178",
    "mx-central-1": "730335286997",
    "us-gov-east-1": "151742754352",
    "us-gov-west-1": "013241004608",
}
"""Account of the EKS add-on image registry where it is not 602401143452 ("View Amazon container image
registries for Amazon EKS add-ons": https://docs.aws.amazon.com/eks/latest/userguide/add-ons-images.html)."""
DEFAULT_EKS_IMAGE_ACCOUNT = "602401143452"


def efa_plugin_repository(region: str) -> str:
    """The EFA device plugin image in the stack's own region (the chart defaults to us-west-2's registry,
    a cross-region pull that fails in partitions and regions without access to it)."""
    account = EKS_IMAGE_ACCOUNTS.get(region, DEFAULT_EKS_IMAGE_ACCOUNT)
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{suffix}/eks/aws-efa-k8s-device-plugin"


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
