"""The EKS control plane (aws_eks_v2, no Auto Mode) and its system node group."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from constructs import Construct

from fsdpkit.infra import kubernetes_versions
from fsdpkit.infra.config import ClusterConfig
from fsdpkit.infra.constructs import launch_template as lt
from fsdpkit.infra.constructs.node_role import node_role

SYSTEM_NODE_LABELS = {"role": "system"}
SYSTEM_ROOT_GIB = 100

_ENDPOINTS = {
    "public": eks.EndpointAccess.PUBLIC,
    "private": eks.EndpointAccess.PRIVATE,
    "public_and_private": eks.EndpointAccess.PUBLIC_AND_PRIVATE,
}
_LOGS = {
    "api": eks.ClusterLoggingTypes.API,
    "audit": eks.ClusterLoggingTypes.AUDIT,
    "authenticator": eks.ClusterLoggingTypes.AUTHENTICATOR,
    "controllerManager": eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    "scheduler": eks.ClusterLoggingTypes.SCHEDULER,
}
ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
_PRIVATE_SUBNETS = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
"""The control plane and the system nodes live in the private subnets (egress through NAT)."""


def kubectl_layer(scope: Construct, version: str) -> object:
    """The kubectl layer for `version` (validation checked that its package is installed)."""
    module = importlib.import_module(kubernetes_versions.layer_module(version))
    layer_class = next(
        getattr(module, n) for n in dir(module) if n.startswith("KubectlV") and n.endswith("Layer")
    )
    return layer_class(scope, "KubectlLayer")


def endpoint_access(cfg: ClusterConfig) -> eks.EndpointAccess:
    """The endpoint setting, narrowed to the allowed CIDRs when any are given."""
    access = _ENDPOINTS[cfg.endpoint_access]
    if cfg.public_access_cidrs:
        access = access.only_from(*cfg.public_access_cidrs)
    return access


class Cluster(Construct):
    """EKS cluster with secrets encryption (KMS), control-plane logs, admin access entries, system nodes.

    The kubectl provider (Lambda + layers) exists only when Kubernetes objects are deployed by CDK;
    everything else is native CloudFormation.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: ClusterConfig,
        name: str,
        vpc: ec2.IVpc,
        with_kubectl: bool,
        instance_tags: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        self.secrets_key = kms.Key(
            self, "SecretsKey", enable_key_rotation=True, description=f"EKS secrets encryption for {name}"
        )
        self.cluster = self._control_plane(cfg, name=name, vpc=vpc, with_kubectl=with_kubectl)
        for index, arn in enumerate(cfg.admin_principal_arns):
            self.cluster.grant_access(
                f"Admin{index}",
                arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        ADMIN_POLICY, access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )

        system_lt = self._system_launch_template(cfg, instance_tags)
        self.system_node_role = node_role(self, "SystemNodeRole")
        self.system_nodegroup = self._system_nodegroup(cfg, system_lt)

    def _control_plane(
        self, cfg: ClusterConfig, *, name: str, vpc: ec2.IVpc, with_kubectl: bool
    ) -> eks.Cluster:
        """The cluster in the private subnets, its secrets sealed with `secrets_key`, without default
        capacity or self-managed add-ons (managed node groups and add-ons replace them)."""
        kubectl = None
        if with_kubectl:
            kubectl = eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer(self, cfg.kubernetes_version),
                # A private-only endpoint is reachable from inside the VPC only.
                private_subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
                if cfg.endpoint_access == "private"
                else None,
            )
        return eks.Cluster(
            self,
            "Cluster",
            cluster_name=name,
            version=eks.KubernetesVersion.of(cfg.kubernetes_version),
            vpc=vpc,
            vpc_subnets=[_PRIVATE_SUBNETS],
            endpoint_access=endpoint_access(cfg),
            cluster_logging=[_LOGS[name_] for name_ in cfg.control_plane_logs],
            secrets_encryption_key=self.secrets_key,
            # Managed node groups below; no Auto Mode, no default capacity.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            # vpc-cni, kube-proxy and CoreDNS come as managed add-ons (versioned, updatable) instead.
            bootstrap_self_managed_addons=False,
            kubectl_provider_options=kubectl,
            output_config_command=False,
        )

    def _system_launch_template(
        self, cfg: ClusterConfig, instance_tags: Mapping[str, str]
    ) -> ec2.CfnLaunchTemplate:
        """The system nodes' instance type, IMDSv2, encrypted root volume and tags."""
        return ec2.CfnLaunchTemplate(
            self,
            "SystemLaunchTemplate",
            tag_specifications=lt.template_tag_specifications(instance_tags),
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                instance_type=cfg.system_instance_type,
                metadata_options=lt.metadata_options(),
                block_device_mappings=[lt.root_volume(size_gib=SYSTEM_ROOT_GIB)],
                tag_specifications=lt.instance_tag_specifications(instance_tags),
            ),
        )

    def _system_nodegroup(self, cfg: ClusterConfig, launch_template: ec2.CfnLaunchTemplate) -> eks.Nodegroup:
        """On-demand system nodes with auto-repair, replaced one at a time."""
        return eks.Nodegroup(
            self,
            "SystemNodegroup",
            cluster=self.cluster,
            node_role=self.system_node_role,
            ami_type=eks.NodegroupAmiType.AL2023_ARM_64_STANDARD
            if cfg.system_is_arm
            else eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            capacity_type=eks.CapacityType.ON_DEMAND,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=launch_template.ref, version=launch_template.attr_latest_version_number
            ),
            subnets=_PRIVATE_SUBNETS,
            min_size=cfg.system_nodes,
            desired_size=cfg.system_nodes,
            max_size=cfg.system_max_nodes,
            labels=dict(SYSTEM_NODE_LABELS),
            enable_node_auto_repair=True,
            max_unavailable=1,
        )
