"""A snapshot of the GPU launch template and node group per instance type and capacity mode.

One light synth for all of them: each stack holds only the GPU node group on an imported cluster, so the
25 combinations cost about as much as one kit. Accept intended changes with `--snapshot-update`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from fsdpkit.infra.config import KitConfig, load_config
from fsdpkit.infra.constructs.gpu_nodegroup import GpuNodeGroup
from fsdpkit.infra.instances import GPU_INSTANCES, efa_count
from tests.infra.conftest import cdk_context

CAPACITY: dict[str, dict[str, str]] = {
    "on_demand": {},
    "odcr": {"gpu.capacity": "odcr", "gpu.reservation_id": "cr-0fedcba9876543210"},
    "capacity_block": {"gpu.capacity": "capacity_block", "gpu.reservation_id": "cr-0123456789abcdef0"},
}
CASES = [
    (name, mode)
    for name, spec in sorted(GPU_INSTANCES.items())
    for mode in CAPACITY
    if mode != "capacity_block" or spec.capacity_blocks
]


@dataclass(frozen=True)
class LayoutSynth:
    configs: dict[tuple[str, str], KitConfig]
    templates: dict[tuple[str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> LayoutSynth:
    context = cdk_context()
    app = cdk.App(
        context={**context, "aws:cdk:disable-asset-staging": True},
        outdir=str(tmp_path_factory.mktemp("layouts.out")),
        analytics_reporting=False,
        builtin_cloud_formation_validation=False,
    )
    configs, names = {}, {}
    for instance, mode in CASES:
        cfg = load_config({**context, "gpu.instance_type": instance, **CAPACITY[mode]})
        name = f"layout-{instance.replace('.', '-')}-{mode.replace('_', '-')}"
        stack = cdk.Stack(app, name, env=cdk.Environment(account=cfg.account, region=cfg.region))
        vpc = ec2.Vpc.from_vpc_attributes(
            stack, "Vpc", vpc_id="vpc-0kit000000000000", availability_zones=[cfg.gpu.availability_zone]
        )
        cluster = eks.Cluster.from_cluster_attributes(
            stack, "Cluster", cluster_name="kit", cluster_security_group_id="sg-0cluster000000000", vpc=vpc
        )
        subnet = ec2.Subnet.from_subnet_attributes(
            stack, "Subnet", subnet_id="subnet-0gpu00000000000", availability_zone=cfg.gpu.availability_zone
        )
        efa = ec2.SecurityGroup.from_security_group_id(stack, "Efa", "sg-0efa0000000000000")
        GpuNodeGroup(
            stack,
            "Gpu",
            cfg=cfg.gpu,
            cluster=cluster,  # type: ignore[arg-type]
            subnet=subnet,
            efa_security_group=efa,
            instance_tags={"kit:project": "fsdp-kit"},
            references_digest="0123456789",
        )
        configs[(instance, mode)] = cfg
        names[(instance, mode)] = name
    assembly = app.synth()
    templates = {key: assembly.get_stack_by_name(name).template for key, name in names.items()}
    return LayoutSynth(configs, templates)


def gpu_parts(template: dict[str, Any]) -> dict[str, Any]:
    """The launch template data and the node group properties, the parts that differ by type and mode."""
    by_type = {r["Type"]: r["Properties"] for r in template["Resources"].values()}
    return {
        "LaunchTemplateData": by_type["AWS::EC2::LaunchTemplate"]["LaunchTemplateData"],
        "Nodegroup": {k: v for k, v in by_type["AWS::EKS::Nodegroup"].items() if k != "NodeRole"},
    }


@pytest.mark.parametrize(("instance", "mode"), CASES)
def test_gpu_layout_snapshot(
    layouts: LayoutSynth, instance: str, mode: str, snapshot: SnapshotAssertion
) -> None:
    assert gpu_parts(layouts.templates[(instance, mode)]) == snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize(("instance", "mode"), CASES)
def test_synthesized_interfaces_match_the_layout(layouts: LayoutSynth, instance: str, mode: str) -> None:
    data = gpu_parts(layouts.templates[(instance, mode)])["LaunchTemplateData"]
    nics = data["NetworkInterfaces"]
    spec = GPU_INSTANCES[instance]
    assert "SecurityGroupIds" not in data
    assert (nics[0]["NetworkCardIndex"], nics[0]["DeviceIndex"]) == (0, 0)
    assert nics[0]["Groups"] == ["sg-0cluster000000000", "sg-0efa0000000000000"]
    assert all(n["Groups"] == ["sg-0efa0000000000000"] for n in nics[1:])
    efa = [n for n in nics if n["InterfaceType"] in ("efa", "efa-only")]
    assert sorted(n["NetworkCardIndex"] for n in efa) == list(spec.efa_cards)
    assert len(efa) == spec.efa_devices
    assert data["InstanceType"] == instance
    market = data.get("InstanceMarketOptions")
    assert market == ({"MarketType": "capacity-block"} if mode == "capacity_block" else None)
    assert ("CapacityReservationSpecification" in data) is (mode != "on_demand")


def test_efa_count_helper_agrees_with_the_specs() -> None:
    from fsdpkit.infra.instances import nic_layout

    assert {n: efa_count(nic_layout(s, "efa-only")) for n, s in GPU_INSTANCES.items()} == {
        n: s.efa_devices for n, s in GPU_INSTANCES.items()
    }
