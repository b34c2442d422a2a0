"""One in-process synth of the kit per test session, in several configurations, for every infra test.

The app gets the committed `cdk.json` context (feature flags and the AZ lookup), so the templates are the
ones `make synth` writes, minus CLI path metadata. cdk-nag's AwsSolutions plugin runs in this synth.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

import aws_cdk as cdk
import pytest
from cdk_nag import AwsSolutionsChecks

from fsdpkit.infra.config import KitConfig, load_config
from fsdpkit.infra.stacks import Kit, build_kit

REPO = Path(__file__).resolve().parents[2]

# Each variant is a set of `-c` style overrides (strings, as the CLI passes them) on top of cdk.json.
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    # Capacity Block, legacy NIC layout, no Kubernetes objects, S3 link on PERSISTENT_2, private endpoint.
    "block": {
        "prefix": "kit-block",
        "gpu.capacity": "capacity_block",
        "gpu.reservation_id": "cr-0123456789abcdef0",
        "gpu.efa_layout": "legacy",
        "gpu.min_nodes": "0",
        "gpu.desired_nodes": "0",
        "gpu.max_nodes": "4",
        "kubernetes.deploy_objects": "false",
        "storage.s3_bucket": "kit-training-data",
        "cluster.endpoint_access": "private",
        "cluster.admin_principal_arns": "arn:aws:iam::111111111111:role/Admin",
        "monitoring.alarm_emails": "oncall@example.com,ml-team@example.org",
        "monitoring.no_progress_minutes": "20",
        "monitoring.goodput_minutes": "12",
        "monitoring.no_spare_alarm": "false",
        "monitoring.log_retention_days": "90",
    },
    # ODCR on p4d, FSx PERSISTENT_1 with an S3 import path, public endpoint narrowed to a CIDR.
    "odcr": {
        "prefix": "kit-odcr",
        "gpu.instance_type": "p4d.24xlarge",
        "gpu.capacity": "odcr",
        "gpu.reservation_id": "cr-0fedcba9876543210",
        "gpu.availability_zone": "us-west-2b",
        "storage.deployment_type": "PERSISTENT_1",
        "storage.throughput_per_tib": "200",
        "storage.storage_gib": "4800",
        "storage.s3_bucket": "kit-training-data",
        "cluster.endpoint_access": "public_and_private",
        "cluster.public_access_cidrs": "203.0.113.0/24",
        "kubernetes.deploy_objects": "false",
        "monitoring.enabled": "false",
    },
    # ODCR through a reservation resource group inside an existing cluster placement group on g6e, public
    # endpoint narrowed, EFA-enabled FSx, a repair override that opts in to replacement, no desired count.
    "grouped": {
        "prefix": "kit-grouped",
        "gpu.instance_type": "g6e.48xlarge",
        "gpu.capacity": "odcr",
        "gpu.reservation_resource_group_arn": (
            "arn:aws:resource-groups:us-west-2:111111111111:group/gpu-odcrs"
        ),
        "gpu.placement_group_name": "my-cluster-pg",
        "gpu.max_nodes": "3",
        "gpu.repair_overrides": "AcceleratedHardwareReady:NvidiaXID79Error:Replace:15",
        "gpu.repair_max_unhealthy_nodes": "2",
        "storage.efa_enabled": "true",
        "cluster.endpoint_access": "public_and_private",
        "cluster.public_access_cidrs": "198.51.100.0/24",
        "kubernetes.deploy_objects": "false",
    },
    # Plain on-demand p5en in a cluster placement group, SCRATCH_2, PVC in its own namespace, private
    # endpoint with Kubernetes objects (the kubectl Lambdas must then run in the VPC), in a region whose EKS
    # images come from another account than 602401143452; the JobSet and Trainer controllers on.
    "placed": {
        "prefix": "kit-placed",
        "region": "ap-southeast-3",
        "network.availability_zones": "ap-southeast-3a,ap-southeast-3b",
        "gpu.availability_zone": "ap-southeast-3a",
        "cluster.endpoint_access": "private",
        "gpu.instance_type": "p5en.48xlarge",
        "gpu.placement_group": "true",
        "storage.deployment_type": "SCRATCH_2",
        "storage.storage_gib": "4800",
        "kubernetes.namespace": "training",
        "kubernetes.job_controllers": "true",
    },
}


TEST_AZ_LOOKUPS = {
    "availability-zones:account=111111111111:region=ap-southeast-3": [
        "ap-southeast-3a",
        "ap-southeast-3b",
        "ap-southeast-3c",
    ]
}
"""AZ lookups of the test-only regions, recorded as the CDK CLI caches them (so synth stays offline)."""


def cdk_context() -> dict[str, Any]:
    """The committed cdk.json context (kit settings, feature flags, AZ lookups) plus TEST_AZ_LOOKUPS."""
    return {**json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"], **TEST_AZ_LOOKUPS}


@dataclass(frozen=True)
class Synth:
    """What one session synth produced."""

    outdir: Path
    configs: dict[str, KitConfig]
    kits: dict[str, Kit]
    templates: dict[str, dict[str, Any]]
    """Stack name -> template (as written to the cloud assembly)."""
    manifest: dict[str, Any]
    validation_report: dict[str, Any]

    def template(self, variant: str, stack: str) -> dict[str, Any]:
        """Template of `stack` (network, storage, registry, cluster) in `variant`."""
        return self.templates[f"{self.configs[variant].prefix}-{stack}"]


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = cdk_context()
    app = cdk.App(
        # Path metadata on, as `cdk synth` writes it; asset staging off (same template, no 57 MB copy).
        context={**context, "aws:cdk:disable-asset-staging": True, "aws:cdk:enable-path-metadata": True},
        outdir=str(outdir),
        analytics_reporting=False,
        builtin_cloud_formation_validation=False,
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    configs = {name: load_config({**context, **overrides}) for name, overrides in VARIANTS.items()}
    kits = {name: build_kit(app, cfg) for name, cfg in configs.items()}
    assembly = app.synth()
    templates = {stack.stack_name: stack.template for stack in assembly.stacks}
    manifest = json.loads((outdir / "manifest.json").read_text(encoding="utf-8"))
    report = json.loads((outdir / "validation-report.json").read_text(encoding="utf-8"))
    return Synth(outdir, configs, kits, templates, manifest, report)


def resources(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    """Logical id -> resource for every resource of one type."""
    return {k: v for k, v in template.get("Resources", {}).items() if v["Type"] == resource_type}


def only(template: dict[str, Any], resource_type: str, where: Any = None) -> dict[str, Any]:
    """Properties of the single resource of a type (optionally filtered by a predicate on its properties)."""
    found = [
        r.get("Properties", {})
        for r in resources(template, resource_type).values()
        if where is None or where(r.get("Properties", {}))
    ]
    assert len(found) == 1, f"expected one {resource_type}, found {len(found)}"
    return found[0]
