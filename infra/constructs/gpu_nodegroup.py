"""The GPU managed node group: one network interface per network card from an L1 launch template."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from fsdpkit.infra.config import GpuConfig, parse_repair_override
from fsdpkit.infra.constructs import launch_template as lt
from fsdpkit.infra.constructs.node_role import node_role
from fsdpkit.infra.instances import GPU_INSTANCES, max_pods, nic_layout

REFERENCES_TAG = "kit:references"
"""Launch-template tag holding the digest of the security groups it names (see fsdpkit.infra.references)."""

_Lt = ec2.CfnLaunchTemplate

GPU_NODE_LABELS: dict[str, str] = {
    "role": "gpu-train",
    "nvidia.com/gpu.present": "true",
    "vpc.amazonaws.com/efa.present": "true",
}
"""Labels on every GPU node; the device plugins and the training Job select by them."""
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT = "NoSchedule"
"""Taint key = the GPU resource name, so EKS's ExtendedResourceToleration adds the toleration to GPU pods."""
GPU_TAINT = f"{GPU_TAINT_KEY}={GPU_TAINT_VALUE}:{GPU_TAINT_EFFECT}"

ROOT_IOPS = 16000
ROOT_THROUGHPUT_MBPS = 1000

_CAPACITY_TYPES = {
    "on_demand": eks.CapacityType.ON_DEMAND,
    "odcr": eks.CapacityType.ON_DEMAND,
    "capacity_block": eks.CapacityType.CAPACITY_BLOCK,
}


def gpu_node_labels_json() -> str:
    """The labels as the one-line JSON object string the `GpuNodeLabels` output carries."""
    return json.dumps(GPU_NODE_LABELS, sort_keys=True, separators=(",", ":"))


def repair_config(cfg: GpuConfig) -> dict[str, object]:
    """NodeRepairConfig (L1 only): one node at a time, a stop threshold, per-condition overrides.

    Keys from the AWS::EKS::Nodegroup NodeRepairConfig schema; each override needs all four values.
    """
    return {
        "Enabled": True,
        "MaxParallelNodesRepairedCount": 1,
        "MaxUnhealthyNodeThresholdCount": cfg.repair_max_unhealthy_nodes,
        "NodeRepairConfigOverrides": [
            {
                "NodeMonitoringCondition": o.condition,
                "NodeUnhealthyReason": o.reason,
                "RepairAction": o.action,
                "MinRepairWaitTimeMins": o.wait_minutes,
            }
            for o in map(parse_repair_override, cfg.repair_overrides)
        ],
    }


def capacity_reservation(cfg: GpuConfig) -> _Lt.CapacityReservationSpecificationProperty | None:
    """Target one reservation, or any reservation of a resource group (odcr), or none."""
    if cfg.reservation_id is None and cfg.reservation_resource_group_arn is None:
        return None
    return _Lt.CapacityReservationSpecificationProperty(
        capacity_reservation_target=_Lt.CapacityReservationTargetProperty(
            capacity_reservation_id=cfg.reservation_id,
            capacity_reservation_resource_group_arn=cfg.reservation_resource_group_arn,
        )
    )


def network_interfaces(
    cfg: GpuConfig, *, cluster_security_group_id: str, efa_security_group_id: str
) -> list[_Lt.NetworkInterfaceProperty]:
    """One launch-template interface per layout entry; security groups per interface, none on the template.

    The primary interface carries the cluster security group (EKS stops adding it once a template names
    groups, and nodes would never join) plus the EFA group; every other interface only the EFA group.
    """
    spec = GPU_INSTANCES[cfg.instance_type]
    return [
        _Lt.NetworkInterfaceProperty(
            network_card_index=entry.network_card_index,
            device_index=entry.device_index,
            interface_type=entry.interface_type,
            groups=[cluster_security_group_id, efa_security_group_id]
            if entry.primary
            else [efa_security_group_id],
            delete_on_termination=True,
        )
        for entry in nic_layout(spec, cfg.efa_layout)
    ]


class GpuNodeGroup(Construct):
    """AL2023 NVIDIA managed node group in one subnet, with EFA on every network card.

    The instance type sits in the launch template (Capacity Blocks require it there). Any launch-template
    change creates a new template version; with a Capacity Block, scale to 0 before deploying it.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: GpuConfig,
        cluster: eks.Cluster,
        subnet: ec2.ISubnet,
        efa_security_group: ec2.ISecurityGroup,
        instance_tags: Mapping[str, str],
        references_digest: str,
    ) -> None:
        super().__init__(scope, construct_id)
        spec = GPU_INSTANCES[cfg.instance_type]
        placement = None
        if cfg.placement_group:
            group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            placement = _Lt.PlacementProperty(group_name=group.ref)
        elif cfg.placement_group_name is not None:
            placement = _Lt.PlacementProperty(group_name=cfg.placement_group_name)
        reservation = capacity_reservation(cfg)
        market = (
            _Lt.InstanceMarketOptionsProperty(market_type="capacity-block")
            if cfg.capacity == "capacity_block"
            else None
        )
        self.launch_template = _Lt(
            self,
            "LaunchTemplate",
            tag_specifications=lt.template_tag_specifications(
                {**instance_tags, REFERENCES_TAG: references_digest}
            ),
            launch_template_data=_Lt.LaunchTemplateDataProperty(
                instance_type=cfg.instance_type,
                network_interfaces=network_interfaces(
                    cfg,
                    cluster_security_group_id=cluster.cluster_security_group_id,
                    efa_security_group_id=efa_security_group.security_group_id,
                ),
                metadata_options=lt.metadata_options(),
                block_device_mappings=[
                    lt.root_volume(
                        size_gib=cfg.root_volume_gib, iops=ROOT_IOPS, throughput_mbps=ROOT_THROUGHPUT_MBPS
                    )
                ],
                user_data=lt.nodeadm_user_data(
                    raid0_local_nvme=spec.local_nvme, max_pods=max_pods(spec, cfg.efa_layout)
                ),
                instance_market_options=market,
                capacity_reservation_specification=reservation,
                placement=placement,
                tag_specifications=lt.instance_tag_specifications(instance_tags),
            ),
        )
        self.node_role = node_role(self, "NodeRole")
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            node_role=self.node_role,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            capacity_type=_CAPACITY_TYPES[cfg.capacity],
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number
            ),
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            min_size=cfg.min_nodes,
            desired_size=cfg.effective_desired_nodes,
            max_size=cfg.max_nodes,
            labels=dict(GPU_NODE_LABELS),
            taints=[
                eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE)
            ],
            enable_node_auto_repair=cfg.node_repair,
            max_unavailable=1,
        )
        if cfg.node_repair:
            # Repair one 8-GPU node at a time: a wrong health verdict must not take the whole job.
            self.nodegroup.node.default_child.add_property_override("NodeRepairConfig", repair_config(cfg))
