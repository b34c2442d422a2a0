"""cdk-nag (AwsSolutions) findings the kit accepts, each with the reason a reviewer would want.

cdk-nag v3 matches acknowledgments per finding (rule plus its detail), not per rule, so every accepted
managed policy is named. Everything else the checks would flag is fixed in the constructs instead
(flow logs, KMS rotation, encrypted volumes, IMDSv2, ECR scan on push, ...).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

from fsdpkit.infra.constructs.addons import ClusterAddons, NetworkingAddons
from fsdpkit.infra.constructs.cluster import Cluster
from fsdpkit.infra.constructs.gpu_nodegroup import GpuNodeGroup

_PREFIX = "AwsSolutions::AwsSolutions-"
_POLICY = "Policy::arn:<AWS::Partition>:iam::aws:policy/"

NODE_ROLE_POLICIES = {
    "AmazonEKSWorkerNodePolicy": "the EKS-documented node role policy; the kubelet needs exactly these "
    "EKS/EC2 reads",
    "AmazonEC2ContainerRegistryReadOnly": "nodes pull the trainer image and EKS add-on images from ECR "
    "(read only)",
    "AmazonSSMManagedInstanceCore": "SSM Session Manager instead of SSH keys (run fi_info and nccl-tests on "
    "a node, reach a private API endpoint); the policy EC2 documents for it",
}
KUBECTL_POLICIES = {
    "service-role/AWSLambdaBasicExecutionRole": "CDK's kubectl provider Lambdas write their own logs only",
    "service-role/AWSLambdaVPCAccessExecutionRole": "CDK's kubectl provider Lambdas may run in the VPC "
    "(private endpoint) and need ENI management for that",
    "AmazonEC2ContainerRegistryReadOnly": "CDK's kubectl handler reads Helm charts from ECR registries",
}


def _ack(scope: IConstruct, finding: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{_PREFIX}{finding}", reason=reason))


def acknowledge_findings(
    *, control_plane: Cluster, gpu: GpuNodeGroup, networking: NetworkingAddons, addons: ClusterAddons
) -> None:
    """Attach the kit's acknowledgments to the constructs they concern (the cluster stack's; the other
    stacks need none). Takes the constructs, not the stacks, so the stacks may import this module."""
    _ack(
        control_plane.cluster,
        f"IAM4[{_POLICY}AmazonEKSClusterPolicy]",
        "EKS requires this AWS-managed policy on the cluster service role; a copy would drift from what "
        "EKS needs",
    )
    for role in (control_plane.system_node_role, gpu.node_role):
        for policy, reason in NODE_ROLE_POLICIES.items():
            _ack(role, f"IAM4[{_POLICY}{policy}]", reason)
    _ack(
        networking.cni_role,
        f"IAM4[{_POLICY}AmazonEKS_CNI_Policy]",
        "the VPC CNI assigns pod IPs and ENIs; AWS maintains the policy as the CNI's API use changes; "
        "bound by Pod Identity to the aws-node service account only (not the node role)",
    )
    _ack(
        addons.fsx_csi_role,
        "IAM5[Resource::*]",
        "fsx:DescribeFileSystems supports no resource-level scoping; the FSx CSI controller's only "
        "permission (static PV: it can neither create nor delete a file system)",
    )
    for policy in ("CloudWatchAgentServerPolicy", "AWSXrayWriteOnlyAccess"):
        _ack(
            addons,
            f"IAM4[{_POLICY}{policy}]",
            "the CloudWatch observability add-on's documented policies (metrics, logs, traces write); "
            "bound by Pod Identity to the cloudwatch-agent service account only",
        )
    provider = control_plane.cluster.node.try_find_child("KubectlProvider")
    if provider is None:  # kubernetes.deploy_objects=false: no Lambdas, nothing more to accept
        return
    for policy, reason in KUBECTL_POLICIES.items():
        _ack(provider, f"IAM4[{_POLICY}{policy}]", reason)
    handler = provider.node.find_child("Handler")
    _ack(
        provider,
        'IAM4[Policy::{"Fn::If":["'
        + _logical_id(handler, "HasEcrPublic")
        + '",{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},'
        + '":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}]',
        "CDK adds ECR Public read only when a chart comes from public.ecr.aws (a condition in the template)",
    )
    _ack(
        provider,
        f"IAM5[Resource::<{_logical_id(handler, 'Resource')}.Arn>:*]",
        "CDK's provider framework invokes any version of its own handler function (`<handler arn>:*`), "
        "nothing else",
    )
    _ack(
        provider,
        "L1",
        "the kubectl handler's Python runtime is chosen by aws-cdk-lib to match the kubectl layer; "
        "it moves with CDK upgrades",
    )


def _logical_id(scope: IConstruct, child: str) -> str:
    """Logical id of `scope`'s child L1 resource or condition, as cdk-nag prints it."""
    element = scope.node.find_child(child)
    return Stack.of(scope).get_logical_id(element)  # type: ignore[arg-type]
