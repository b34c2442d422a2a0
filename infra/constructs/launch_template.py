"""Launch-template pieces shared by the node groups: IMDSv2, encrypted gp3 root, instance tags, nodeadm."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import CfnTag, Fn
from aws_cdk import aws_ec2 as ec2

_Lt = ec2.CfnLaunchTemplate

ROOT_DEVICE = "/dev/xvda"
"""Root device name of the EKS AL2023 AMIs."""
TAGGED_RESOURCE_TYPES = ("instance", "volume", "network-interface")
"""Managed node groups do not pass their tags to instances; the launch template does."""

NODEADM_BOUNDARY = "==KITBOUNDARY=="


IMDS_HOP_LIMIT = 1
"""Only the node itself (and host-network pods) reach IMDS; pods get AWS credentials through Pod Identity
(EKS best practices, "Restrict access to the instance profile":
https://docs.aws.amazon.com/eks/latest/best-practices/identity-and-access-management.html)."""


def metadata_options() -> _Lt.MetadataOptionsProperty:
    """IMDSv2 only, hop limit 1: a pod cannot borrow the node role's credentials."""
    return _Lt.MetadataOptionsProperty(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT
    )


def root_volume(
    *, size_gib: int, iops: int = 3000, throughput_mbps: int = 125
) -> _Lt.BlockDeviceMappingProperty:
    """Encrypted gp3 root volume, deleted with the instance."""
    return _Lt.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=_Lt.EbsProperty(
            volume_size=size_gib,
            volume_type="gp3",
            iops=iops,
            throughput=throughput_mbps,
            encrypted=True,
            delete_on_termination=True,
        ),
    )


def instance_tag_specifications(tags: Mapping[str, str]) -> list[_Lt.TagSpecificationProperty]:
    """Tag what the node group launches (instances, their volumes and interfaces) with the kit's tags."""
    tag_list = [{"key": k, "value": v} for k, v in sorted(tags.items())]
    return [
        _Lt.TagSpecificationProperty(resource_type=kind, tags=[CfnTag(**t) for t in tag_list])
        for kind in TAGGED_RESOURCE_TYPES
    ]


def template_tag_specifications(
    tags: Mapping[str, str],
) -> list[ec2.CfnLaunchTemplate.LaunchTemplateTagSpecificationProperty]:
    """Tags on the launch template resource itself (the CDK tag aspect does not reach this L1 property).

    The GPU template adds `kit:references` (a digest of the security groups it names,
    `fsdpkit.infra.references`).
    """
    return [
        _Lt.LaunchTemplateTagSpecificationProperty(
            resource_type="launch-template", tags=[CfnTag(key=k, value=v) for k, v in sorted(tags.items())]
        )
    ]


def nodeadm_user_data(*, raid0_local_nvme: bool, max_pods: int | None = None) -> str | None:
    """MIME multipart user data with a nodeadm NodeConfig; EKS merges it with its own bootstrap part.

    RAID0 over the local NVMe drives gives containerd and kubelet the instance store (p5: 8 x 3.84 TB);
    `max_pods` sets the kubelet's maxPods (nodeadm's own table ignores EFA-only devices).
    """
    if not raid0_local_nvme and max_pods is None:
        return None
    spec = []
    if max_pods is not None:
        spec += ["  kubelet:", "    config:", f"      maxPods: {max_pods}"]
    if raid0_local_nvme:
        spec += ["  instance:", "    localStorage:", "      strategy: RAID0"]
    body = "\n".join(
        [
            "MIME-Version: 1.0",
            f'Content-Type: multipart/mixed; boundary="{NODEADM_BOUNDARY}"',
            "",
            f"--{NODEADM_BOUNDARY}",
            "Content-Type: application/node.eks.aws",
            "",
            "---",
            "apiVersion: node.eks.aws/v1alpha1",
            "kind: NodeConfig",
            "spec:",
            *spec,
            "",
            f"--{NODEADM_BOUNDARY}--",
            "",
        ]
    )
    return Fn.base64(body)
