"""EKS managed add-ons, with Pod Identity roles for the ones that call AWS APIs.

Add-on versions are left to EKS (the default version for the cluster's Kubernetes version), so a
Kubernetes upgrade never pins an incompatible add-on; the device plugins, which EKS does not manage,
are pinned in `device_plugins.py`. `ConfigurationValues` use only keys of each add-on's published schema
(`aws eks describe-addon-configuration`; EKS rejects unknown keys at deploy); tests check them against copies
of those schemas in tests/infra/fixtures/addon_schemas/, and nothing is set that only repeats a default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

CLOUDWATCH_CONFIGURATION = {
    "agent": {
        "config": {
            "logs": {
                "metrics_collected": {
                    "kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": False},
                    "emf": {},
                }
            }
        }
    }
}
"""Container Insights without the add-on's own DCGM exporter: the node monitoring agent already runs DCGM on
the GPU nodes, and two DCGM host engines on the same GPUs make the agent report AcceleratedHardwareReady=False
(aws/containers-roadmap#2555), after which auto-repair replaces healthy nodes. Opt-out documented in
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/install-CloudWatch-Observability-EKS-addon.html.

`emf` opens the agent's Embedded Metric Format listener (TCP and UDP 25888, on the `cloudwatch-agent` Service
the add-on's operator creates in `amazon-cloudwatch`): the trainer and launcher send their live metrics there
(training/runtime/telemetry), and the agent writes each record to the log group it names, which makes the
metrics.

`agent.config` replaces the agent's default configuration, it is not merged into it: every default entry the
kit does not repeat is dropped (CLOUDWATCH_DROPPED_DEFAULTS)."""
CLOUDWATCH_DEFAULT_AGENT_CONFIG = {
    "logs": {
        "metrics_collected": {"application_signals": {}, "kubernetes": {"enhanced_container_insights": True}}
    },
    "traces": {"traces_collected": {"application_signals": {}}},
}
"""The add-on's documented default `agent.config` (same page), used when none is given."""
CLOUDWATCH_DROPPED_DEFAULTS = (
    "logs.metrics_collected.application_signals",
    "traces.traces_collected.application_signals",
)
"""Default entries the kit's `agent.config` drops: Application Signals metrics and traces (APM for
instrumented services; a training Job is not one)."""
VPC_CNI_CONFIGURATION = {"enableNetworkPolicy": "true"}
"""Network policy enforcement: the add-on starts its network policy agent (a second container in each
`aws-node` pod, eBPF on the pods' host veths), and the EKS control plane's policy controller resolves the
kit's per-run NetworkPolicy objects for it. Without it a NetworkPolicy is an object nothing enforces.
Source: https://docs.aws.amazon.com/eks/latest/userguide/cni-network-policy-configure.html (steps 2 and 4;
the BPF file system and kernel >= 5.10 the agent needs come with the AL2023 EKS AMIs of Kubernetes >= 1.27).
Left at their defaults: the agent's ports (8162 metrics, 8163 health; the kit listens on neither), and the
`standard` mode (a new pod is open until its policies are applied): `strict` denies every new pod of the
cluster that has no policy, CoreDNS and other teams' workloads included (docs/security.md)."""
FSX_CSI_ACTIONS = ("fsx:DescribeFileSystems",)
"""The controller only serves a static PV (no CreateFileSystem/DeleteFileSystem): describe is all it calls."""


def pod_identity_role(scope: Construct, construct_id: str, *, managed_policies: Sequence[str]) -> iam.Role:
    """IAM role that EKS Pod Identity can assume for a service account (sts:AssumeRole + sts:TagSession)."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(name) for name in managed_policies],
    )


def _addon(
    scope: Construct,
    construct_id: str,
    *,
    cluster: eks.Cluster,
    name: str,
    after: Sequence[IConstruct] = (),
    configuration: dict[str, Any] | None = None,
    service_account: str | None = None,
    role: iam.IRole | None = None,
) -> eks.Addon:
    """One managed add-on; `after` lists what must exist first; `service_account` + `role` bind Pod
    Identity."""
    addon = eks.Addon(
        scope,
        construct_id,
        cluster=cluster,
        addon_name=name,
        configuration_values=configuration,
        preserve_on_delete=False,
    )
    cfn = addon.node.default_child
    # Adopt what is already there (e.g. after a manual install) instead of failing the deploy.
    cfn.add_property_override("ResolveConflicts", "OVERWRITE")
    if service_account is not None and role is not None:
        cfn.add_property_override(
            "PodIdentityAssociations", [{"ServiceAccount": service_account, "RoleArn": role.role_arn}]
        )
    for dependency in after:
        addon.node.add_dependency(dependency)
    return addon


class NetworkingAddons(Construct):
    """vpc-cni, kube-proxy and the Pod Identity agent: DaemonSets the nodes need before they are Ready.

    The VPC CNI gets its policy through Pod Identity on `aws-node`, not from the node role (the agent runs on
    the host network, so it serves credentials before any pod has an address), and enforces NetworkPolicy
    (`VPC_CNI_CONFIGURATION`).
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster) -> None:
        super().__init__(scope, construct_id)
        # The agent's DaemonSet tolerates every taint by default, so it also runs on the GPU nodes.
        self.pod_identity_agent = _addon(
            self, "PodIdentityAgent", cluster=cluster, name="eks-pod-identity-agent"
        )
        self.cni_role = pod_identity_role(self, "VpcCniRole", managed_policies=["AmazonEKS_CNI_Policy"])
        self.vpc_cni = _addon(
            self,
            "VpcCni",
            cluster=cluster,
            name="vpc-cni",
            after=[self.pod_identity_agent],
            configuration=VPC_CNI_CONFIGURATION,
            service_account="aws-node",
            role=self.cni_role,
        )
        self.kube_proxy = _addon(self, "KubeProxy", cluster=cluster, name="kube-proxy")

    @property
    def all(self) -> list[eks.Addon]:
        """Every add-on here, for `add_dependency` on the node groups."""
        return [self.vpc_cni, self.kube_proxy, self.pod_identity_agent]


class ClusterAddons(Construct):
    """CoreDNS, FSx CSI driver, node monitoring agent and CloudWatch observability.

    These run Deployments, so they wait for the system node group; the ones that call AWS get a Pod
    Identity role (no OIDC provider, no extra Lambda).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        system_nodes: IConstruct,
        pod_identity_agent: eks.Addon,
    ) -> None:
        super().__init__(scope, construct_id)
        after = [system_nodes, pod_identity_agent]
        self.coredns = _addon(self, "CoreDns", cluster=cluster, name="coredns", after=after)
        fsx_role = pod_identity_role(self, "FsxCsiRole", managed_policies=[])
        fsx_role.add_to_policy(iam.PolicyStatement(actions=list(FSX_CSI_ACTIONS), resources=["*"]))
        self.fsx_csi_role = fsx_role
        # No configuration: the chart's node DaemonSet already tolerates every taint.
        self.fsx_csi = _addon(
            self,
            "FsxCsi",
            cluster=cluster,
            name="aws-fsx-csi-driver",
            after=after,
            service_account="fsx-csi-controller-sa",
            role=fsx_role,
        )
        self.node_monitoring = _addon(
            self, "NodeMonitoring", cluster=cluster, name="eks-node-monitoring-agent", after=after
        )
        cloudwatch_role = pod_identity_role(
            self, "CloudWatchRole", managed_policies=["CloudWatchAgentServerPolicy", "AWSXrayWriteOnlyAccess"]
        )
        self.cloudwatch = _addon(
            self,
            "CloudWatch",
            cluster=cluster,
            name="amazon-cloudwatch-observability",
            after=after,
            configuration=CLOUDWATCH_CONFIGURATION,
            service_account="cloudwatch-agent",
            role=cloudwatch_role,
        )
