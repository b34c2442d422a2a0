"""Rules that span config sections. Each raises ConfigError naming the key, the value and what is allowed."""

from __future__ import annotations

import importlib.util

from fsdpkit.infra import eks_images, kubernetes_versions, sizing
from fsdpkit.infra.errors import ConfigError
from fsdpkit.infra.sections import ClusterConfig, GpuConfig, KubernetesConfig, NetworkConfig, StorageConfig


def check_cross_rules(
    *,
    region: str,
    network: NetworkConfig,
    gpu: GpuConfig,
    cluster: ClusterConfig,
    kubernetes: KubernetesConfig,
    storage: StorageConfig,
) -> None:
    """AZs belong to the region; the GPU nodes (and FSx, which follows them) sit in one of the VPC's AZs;
    FSx writes a checkpoint in time; with Kubernetes objects, the kubectl layer for the Kubernetes version is
    installed and the region's EKS image registry is known."""
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
    check_checkpoint_write(storage=storage, gpu=gpu)
    if kubernetes.deploy_objects:
        eks_images.check_region(region)  # the EFA device plugin's image registry
        module = kubernetes_versions.layer_module(cluster.kubernetes_version)
        if importlib.util.find_spec(module) is None:
            package = "aws-cdk." + module.removeprefix("aws_cdk.").replace("_", "-")
            raise ConfigError(
                "cluster.kubernetes_version",
                f"{cluster.kubernetes_version} needs the kubectl layer package {package}, which is not "
                "installed; pip install it (in a checkout: add it to pyproject.toml's infra extra, then "
                "make lock), or set kubernetes.deploy_objects=false",
            )


def check_checkpoint_write(*, storage: StorageConfig, gpu: GpuConfig) -> None:
    """FSx must absorb one full checkpoint from the GPU nodes within storage.checkpoint_write_s."""
    per_tib = storage.effective_throughput_per_tib or sizing.SCRATCH_2_MBPS_PER_TIB
    fs_mbps = sizing.fsx_mbps(storage.storage_gib, per_tib)
    seconds = sizing.write_seconds(checkpoint_gb=storage.checkpoint_gb, fs_mbps=fs_mbps, nodes=gpu.max_nodes)
    if seconds <= storage.checkpoint_write_s:
        return
    enough = sizing.smallest_storage_gib(
        checkpoint_gb=storage.checkpoint_gb, budget_s=storage.checkpoint_write_s, throughput_per_tib=per_tib
    )
    raise ConfigError(
        "storage.storage_gib",
        f"{storage.storage_gib} GiB at {per_tib} MB/s/TiB gives {fs_mbps:.0f} MB/s and writes a "
        f"{storage.checkpoint_gb} GB checkpoint in {seconds:.0f} s, over storage.checkpoint_write_s="
        f"{storage.checkpoint_write_s}; use storage.storage_gib={enough} (or a higher throughput_per_tib)",
    )


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
