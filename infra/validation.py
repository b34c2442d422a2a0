"""Rules that span config sections. Each raises ConfigError naming the key, the value and what is allowed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.errors import ConfigError

if TYPE_CHECKING:
    from infra.config import ClusterConfig, GpuConfig, KubernetesConfig, NetworkConfig


def check_cross_rules(
    *,
    region: str,
    network: NetworkConfig,
    gpu: GpuConfig,
    cluster: ClusterConfig,
    kubernetes: KubernetesConfig,
) -> None:
    """AZs belong to the region; the GPU nodes (and FSx, which follows them) sit in one of the VPC's AZs."""
    for az in network.availability_zones:
        if not (az.startswith(region) and len(az) == len(region) + 1):
            raise ConfigError(
                "network.availability_zones",
                f"{az!r} is not in region {region!r}; use AZs like '{region}a', '{region}b'",
            )
    if gpu.availability_zone not in network.availability_zones:
        raise ConfigError(
            "gpu.availability_zone",
            f"{gpu.availability_zone!r} is not in network.availability_zones; use one of: "
            + ", ".join(network.availability_zones),
        )
    del cluster, kubernetes  # no cross rules today; passed so new ones have one home


def az_context_key(account: str, region: str) -> str:
    """The context key where the CDK caches (and cdk.json commits) a region's AZ lookup."""
    return f"availability-zones:account={account}:region={region}"


def check_known_azs(*, account: str, region: str, network: NetworkConfig, known: object) -> None:
    """The VPC's AZs must be among the region's AZs recorded in context (when the lookup is recorded).

    Without this, ec2.Vpc fails later with a stack trace; with no record, the CLI looks the AZs up
    (credentials needed) and this rule has nothing to check.
    """
    if not isinstance(known, list):
        return
    for az in network.availability_zones:
        if az not in known:
            raise ConfigError(
                "network.availability_zones",
                f"{az!r} is not an AZ of account {account} in {region} (context "
                f"'{az_context_key(account, region)}'); use AZs from: {', '.join(map(str, known))}",
            )
