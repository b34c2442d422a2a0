"""The IAM role of the kit's managed node groups: what the kubelet and SSM need, not the VPC CNI's policy."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from constructs import Construct

NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",
)
"""The kubelet's EKS/EC2 reads, image pulls from ECR, and SSM Session Manager (no SSH keys; run
`fi_info -p efa` and nccl-tests on a node). The VPC CNI's AmazonEKS_CNI_Policy is bound to the `aws-node`
service account through Pod Identity instead (https://docs.aws.amazon.com/eks/latest/userguide/cni-iam-role.html)."""


def node_role(scope: Construct, construct_id: str) -> iam.Role:
    """A node instance role with NODE_POLICIES only."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(name) for name in NODE_POLICIES],
    )
