"""The sections of the kit's settings (`network.*`, `cluster.*`, `gpu.*`, ...), one frozen dataclass each.

Each section checks its own rules in `__post_init__`; `fsdpkit.infra.config` composes them into `KitConfig`,
reads
them from context, and runs the rules across sections (`fsdpkit.infra.validation`), which read these types.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import typing
from dataclasses import dataclass
from typing import Literal

from fsdpkit.contracts.metrics_catalog import AlarmThresholds
from fsdpkit.infra.errors import ConfigError, require
from fsdpkit.infra.instances import GPU_INSTANCES, EfaLayout

KubernetesVersion = Literal["1.34", "1.35", "1.36", "1.37"]
EndpointAccess = Literal["public", "private", "public_and_private"]
ControlPlaneLog = Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]
Capacity = Literal["on_demand", "odcr", "capacity_block"]
DeploymentType = Literal["PERSISTENT_2", "PERSISTENT_1", "SCRATCH_2"]

_AZ_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
_INSTANCE_RE = re.compile(r"^[a-z][a-z0-9-]*\d[a-z0-9-]*\.[a-z0-9]+$")
_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{17}$")
_RESOURCE_GROUP_RE = re.compile(r"^arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:\d{12}:group/[\w.-]{1,128}$")
_PLACEMENT_GROUP_RE = re.compile(r"^[\w.:/+=@-][\w .:/+=@-]{0,254}$")
RepairAction = Literal["Replace", "Reboot", "NoAction"]
REPAIR_ACTIONS: tuple[str, ...] = typing.get_args(RepairAction)
REPAIR_CONDITIONS = (
    "AcceleratedHardwareReady",
    "ContainerRuntimeReady",
    "KernelReady",
    "NetworkingReady",
    "StorageReady",
)
"""Node conditions the EKS node monitoring agent reports (https://docs.aws.amazon.com/eks/latest/userguide/node-health.html)."""
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_DNS_LABEL_RE = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_CHART_VERSION_RE = re.compile(r"^v?\d+\.\d+\.\d+$")

# FSx for Lustre SSD rules (AWS FSx for Lustre user guide, "Storage capacity" and "Throughput").
FSX_THROUGHPUT_PER_TIB: dict[str, tuple[int, ...]] = {
    "PERSISTENT_2": (125, 250, 500, 1000),
    "PERSISTENT_1": (50, 100, 200),
    "SCRATCH_2": (),
}
FSX_DEFAULT_THROUGHPUT_PER_TIB: dict[str, int | None] = {
    "PERSISTENT_2": 1000,
    "PERSISTENT_1": 200,
    "SCRATCH_2": None,
}


MANAGED_NODE_GROUP_MAX_NODES = 450
"""EKS quota "Nodes per managed node group" (not adjustable):
https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html."""
CHECKPOINT_WRITE_S_MAX = 3600
"""Longest checkpoint write the kit sizes FSx for: beyond an hour a checkpoint no longer bounds lost work."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkConfig:
    """The VPC: private subnets over two or more AZs, one NAT gateway by default."""

    availability_zones: tuple[str, ...]
    """AZs of the VPC (2 or more, in `region`); one private /18 and one public /24 subnet each."""
    vpc_cidr: str = "10.0.0.0/16"
    """IPv4 CIDR of the VPC; must hold a /18 plus a /24 per AZ (VPC CNI gives every pod a VPC IP)."""
    nat_gateways: int = 1
    """NAT gateways (1 .. number of AZs); one per AZ survives an AZ outage, at extra cost."""

    def __post_init__(self) -> None:
        key = "network.availability_zones"
        require(len(self.availability_zones) >= 2, key, "list at least 2 AZs (the EKS control plane needs 2)")
        require(
            len(set(self.availability_zones)) == len(self.availability_zones),
            key,
            f"AZs must be distinct, got {','.join(self.availability_zones)}",
        )
        for az in self.availability_zones:
            require(bool(_AZ_RE.match(az)), key, f"{az!r} is not an AZ name like 'us-west-2a'")
        try:
            net = ipaddress.IPv4Network(self.vpc_cidr)
        except ValueError:
            raise ConfigError(
                "network.vpc_cidr", f"{self.vpc_cidr!r} is not an IPv4 CIDR like '10.0.0.0/16'"
            ) from None
        need = len(self.availability_zones) * (2**14 + 2**8)
        require(
            net.num_addresses >= need,
            "network.vpc_cidr",
            f"{self.vpc_cidr} holds {net.num_addresses} addresses but {len(self.availability_zones)} AZs "
            f"need {need} (a /18 and a /24 each); use a larger block or fewer AZs",
        )
        require(
            1 <= self.nat_gateways <= len(self.availability_zones),
            "network.nat_gateways",
            f"{self.nat_gateways} is not allowed; use 1 .. {len(self.availability_zones)} "
            "(one per AZ at most)",
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterConfig:
    """The EKS control plane (aws_eks_v2, managed node groups, no Auto Mode) and the system node group."""

    kubernetes_version: KubernetesVersion = "1.36"
    """Kubernetes minor version of the control plane; default: the newest in EKS standard support that the
    installed kubectl layer drives. 1.37 with `kubernetes.deploy_objects` needs the kubectl v37 layer package.
    Synth says when the version leaves standard support (extended support costs 6x)."""
    endpoint_access: EndpointAccess = "private"
    """Who can reach the Kubernetes API: `private` (VPC only; reach it through SSM, docs/infra.md) or
    `public_and_private` with `public_access_cidrs`. `public` alone is refused (nodes behind NAT would need
    0.0.0.0/0)."""
    public_access_cidrs: tuple[str, ...] = ()
    """CIDRs allowed to reach the public endpoint; required with public_and_private (give 0.0.0.0/0
    explicitly to open it to any address)."""
    admin_principal_arns: tuple[str, ...] = ()
    """IAM role/user ARNs given cluster-admin access entries (AmazonEKSClusterAdminPolicy, cluster scope)."""
    control_plane_logs: tuple[ControlPlaneLog, ...] = ("api", "audit", "authenticator")
    """Control-plane log types sent to CloudWatch Logs (at least one)."""
    system_instance_type: str = "m7i.2xlarge"
    """Instance type of the system node group (CoreDNS, CSI controllers, agents); x86 or Graviton."""
    system_nodes: int = 2
    """Minimum and desired size of the system node group (1 or more; 2 keeps CoreDNS highly available)."""
    system_max_nodes: int = 4
    """Maximum size of the system node group (>= system_nodes)."""

    def __post_init__(self) -> None:
        for cidr in self.public_access_cidrs:
            try:
                ipaddress.IPv4Network(cidr)
            except ValueError:
                raise ConfigError("cluster.public_access_cidrs", f"{cidr!r} is not an IPv4 CIDR") from None
        require(
            self.endpoint_access != "public",
            "cluster.endpoint_access",
            "'public' is not allowed: nodes reach a public-only endpoint through NAT, which needs it open to "
            "0.0.0.0/0; use public_and_private with cluster.public_access_cidrs, or private",
        )
        require(
            self.endpoint_access != "public_and_private" or bool(self.public_access_cidrs),
            "cluster.public_access_cidrs",
            "required with cluster.endpoint_access='public_and_private' (the public endpoint is not "
            "opened to 0.0.0.0/0 by default); give your CIDRs, e.g. 203.0.113.0/24, or use private",
        )
        require(
            not self.public_access_cidrs or self.endpoint_access == "public_and_private",
            "cluster.public_access_cidrs",
            f"not allowed with cluster.endpoint_access={self.endpoint_access!r} (nodes would lose the API); "
            "use public_and_private, or remove the CIDRs",
        )
        for arn in self.admin_principal_arns:
            require(
                bool(_ARN_RE.match(arn)),
                "cluster.admin_principal_arns",
                f"{arn!r} is not an IAM role or user ARN like 'arn:aws:iam::123456789012:role/Admin'",
            )
        require(bool(self.control_plane_logs), "cluster.control_plane_logs", "name at least one log type")
        require(
            bool(_INSTANCE_RE.match(self.system_instance_type)),
            "cluster.system_instance_type",
            f"{self.system_instance_type!r} is not an EC2 instance type like 'm7i.2xlarge'",
        )
        require(
            self.system_nodes >= 1,
            "cluster.system_nodes",
            f"{self.system_nodes} is not allowed; use 1 or more",
        )
        require(
            self.system_max_nodes >= self.system_nodes,
            "cluster.system_max_nodes",
            f"{self.system_max_nodes} is below cluster.system_nodes={self.system_nodes}; "
            f"use >= {self.system_nodes}",
        )

    @property
    def system_is_arm(self) -> bool:
        """True for Graviton families (m7g, c7gn, r8g, ...): the node group then needs the ARM AMI."""
        family = self.system_instance_type.split(".", 1)[0]
        return bool(re.match(r"^[a-z]+\d+[a-z]*g[a-z]*(-flex)?$", family))


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuConfig:
    """The GPU managed node group: EFA launch template, capacity, size."""

    availability_zone: str
    """AZ of the GPU nodes and the FSx file system (a Capacity Block's AZ); one of
    network.availability_zones."""
    instance_type: str = "p5.48xlarge"
    """EFA GPU instance type: g5.48xlarge, g6e.48xlarge, p4d.24xlarge, p4de.24xlarge, p5.48xlarge,
    p5e.48xlarge, p5en.48xlarge, p6-b200.48xlarge, p6-b300.48xlarge."""
    min_nodes: int = 0
    """Minimum GPU nodes (>= 0)."""
    desired_nodes: int | None = None
    """GPU nodes to run now (min_nodes .. max_nodes). Unset: min_nodes (0) in every capacity mode, so a
    deploy without capacity (no quota, an ODCR that is short, inactive or in another AZ, a block not yet
    active) still builds cluster, FSx and ECR. Set it to scale (`-c gpu.desired_nodes=2`): with an ODCR up to
    the reservation's count, with a Capacity Block once the block is active."""
    max_nodes: int = 2
    """Maximum GPU nodes (1 .. 450, EKS's limit for one managed node group)."""
    capacity: Capacity = "on_demand"
    """Where instances come from: `on_demand`, `odcr` (On-Demand Capacity Reservation) or `capacity_block`."""
    reservation_id: str | None = None
    """Capacity reservation id `cr-...` (17 hex digits); required for capacity_block, for odcr unless
    reservation_resource_group_arn is set; else unset."""
    reservation_resource_group_arn: str | None = None
    """odcr only: a capacity reservation resource group ARN (`arn:aws:resource-groups:...:group/NAME`) to
    launch into any reservation of the group, instead of one reservation_id."""
    placement_group: bool = False
    """Create a cluster placement group for the GPU nodes; only for plain on_demand."""
    placement_group_name: str | None = None
    """Existing cluster placement group to launch into: on_demand, or odcr when the reservation was created
    in that group (EC2 places reservations in cluster placement groups). Refused with capacity_block."""
    efa_layout: EfaLayout = "efa-only"
    """NIC layout: `efa-only` (ENA primary + one EFA-only device per card, 1 IP per node) or `legacy`
    (EFA on every card, 1 IP per card)."""
    root_volume_gib: int = 512
    """Root EBS volume size in GiB (gp3, encrypted, 16,000 IOPS, 1,000 MB/s); 64 .. 16384."""
    node_repair: bool = True
    """EKS node auto-repair (repairs unhealthy GPU nodes one at a time; pairs with the node monitoring
    agent)."""
    repair_overrides: tuple[str, ...] = ("AcceleratedHardwareReady:DCGMError:NoAction:10",)
    """Per-condition repair actions, `Condition:Reason:Action:WaitMinutes` (Action Replace, Reboot or
    NoAction). Default: no action when the agent only lost its DCGM connection (aws/containers-roadmap#2555);
    add e.g. `AcceleratedHardwareReady:NvidiaXID79Error:Replace:10` to opt in to replacements."""
    repair_max_unhealthy_nodes: int = 1
    """Auto-repair stops when more GPU nodes than this are unhealthy at once (a cluster-wide fault is not
    fixed by replacing nodes); 1 .. max_nodes."""

    def __post_init__(self) -> None:
        require(
            bool(_AZ_RE.match(self.availability_zone)),
            "gpu.availability_zone",
            f"{self.availability_zone!r} is not an AZ name like 'us-west-2a'",
        )
        require(
            self.instance_type in GPU_INSTANCES,
            "gpu.instance_type",
            f"{self.instance_type!r} has no EFA network-card layout in the kit; use one of: "
            + ", ".join(sorted(GPU_INSTANCES)),
        )
        require(
            1 <= self.max_nodes <= MANAGED_NODE_GROUP_MAX_NODES,
            "gpu.max_nodes",
            f"{self.max_nodes} is not allowed; use 1 .. {MANAGED_NODE_GROUP_MAX_NODES} "
            "(the most nodes one EKS managed node group holds)",
        )
        require(self.min_nodes >= 0, "gpu.min_nodes", f"{self.min_nodes} is not allowed; use 0 or more")
        require(
            self.min_nodes <= self.max_nodes,
            "gpu.min_nodes",
            f"{self.min_nodes} is above gpu.max_nodes={self.max_nodes}; use 0 .. {self.max_nodes}",
        )
        if self.desired_nodes is not None:
            require(
                self.min_nodes <= self.desired_nodes <= self.max_nodes,
                "gpu.desired_nodes",
                f"{self.desired_nodes} is outside gpu.min_nodes .. gpu.max_nodes; "
                f"use {self.min_nodes} .. {self.max_nodes}",
            )
        self._check_capacity_names()
        self._check_capacity()
        self._check_repair()
        require(
            64 <= self.root_volume_gib <= 16384,
            "gpu.root_volume_gib",
            f"{self.root_volume_gib} is not allowed; use 64 .. 16384",
        )

    def _check_capacity_names(self) -> None:
        """Reservation, resource group and placement group are well formed and not given twice over."""
        if self.reservation_id is not None:
            require(
                bool(_RESERVATION_RE.match(self.reservation_id)),
                "gpu.reservation_id",
                f"{self.reservation_id!r} is not a capacity reservation id ('cr-' + 17 hex digits)",
            )
        group = self.reservation_resource_group_arn
        if group is not None:
            require(
                bool(_RESOURCE_GROUP_RE.match(group)),
                "gpu.reservation_resource_group_arn",
                f"{group!r} is not a resource group ARN like "
                "'arn:aws:resource-groups:us-west-2:123456789012:group/p5-reservations'",
            )
            require(
                self.capacity == "odcr",
                "gpu.reservation_resource_group_arn",
                f"only with gpu.capacity=odcr, not {self.capacity!r}; unset it or use odcr",
            )
            require(
                self.reservation_id is None,
                "gpu.reservation_resource_group_arn",
                "give either gpu.reservation_id or gpu.reservation_resource_group_arn, not both",
            )
        if self.placement_group_name is not None:
            require(
                bool(_PLACEMENT_GROUP_RE.match(self.placement_group_name)),
                "gpu.placement_group_name",
                f"{self.placement_group_name!r} is not a placement group name "
                "(1-255 letters, digits, spaces, ._-, not starting with a space)",
            )
            require(
                not self.placement_group,
                "gpu.placement_group",
                "give either gpu.placement_group=true (create one) or gpu.placement_group_name (use yours)",
            )

    def _check_capacity(self) -> None:
        """Reservation, resource group and placement group fit the capacity mode."""
        if self.capacity == "on_demand":
            require(
                self.reservation_id is None,
                "gpu.reservation_id",
                f"{self.reservation_id!r} is set but gpu.capacity is 'on_demand'; "
                "use gpu.capacity=odcr or capacity_block, or unset it",
            )
            return
        if self.capacity == "capacity_block":
            require(
                GPU_INSTANCES[self.instance_type].capacity_blocks,
                "gpu.capacity",
                f"'capacity_block' is not offered for {self.instance_type}; use on_demand or odcr, "
                "or one of: "
                + ", ".join(sorted(n for n, spec in GPU_INSTANCES.items() if spec.capacity_blocks)),
            )
            require(
                self.reservation_id is not None,
                "gpu.reservation_id",
                "required when gpu.capacity is 'capacity_block'; "
                "give the reservation id 'cr-' + 17 hex digits",
            )
            require(
                not self.placement_group and self.placement_group_name is None,
                "gpu.placement_group",
                "not allowed with gpu.capacity='capacity_block': the block already fixes placement, and a "
                "placement group on a Capacity Block fails with InsufficientInstanceCapacity; unset it",
            )
            return
        require(
            self.reservation_id is not None or self.reservation_resource_group_arn is not None,
            "gpu.reservation_id",
            "required when gpu.capacity is 'odcr'; give the reservation id 'cr-' + 17 hex digits, "
            "or gpu.reservation_resource_group_arn",
        )
        require(
            not self.placement_group,
            "gpu.placement_group",
            "not allowed with gpu.capacity='odcr': a new placement group cannot hold an existing "
            "reservation; give the group the reservation was created in as gpu.placement_group_name, "
            "or unset it",
        )

    def _check_repair(self) -> None:
        """Repair overrides parse; the unhealthy-node threshold fits the node group."""
        seen: dict[tuple[str, str], str] = {}
        for entry in self.repair_overrides:
            parsed = parse_repair_override(entry)
            pair = (parsed.condition, parsed.reason)
            require(
                pair not in seen,
                "gpu.repair_overrides",
                f"{seen.get(pair)!r} and {entry!r} both set {pair[0]}:{pair[1]}; keep one of them",
            )
            seen[pair] = entry
        require(
            1 <= self.repair_max_unhealthy_nodes <= self.max_nodes,
            "gpu.repair_max_unhealthy_nodes",
            f"{self.repair_max_unhealthy_nodes} is not allowed; use 1 .. gpu.max_nodes ({self.max_nodes})",
        )

    @property
    def effective_desired_nodes(self) -> int:
        """Nodes the group asks for: desired_nodes, else min_nodes in every capacity mode.

        Synth cannot see whether an ODCR holds max_nodes, is active, in the AZ or of the type; a node group
        that fails to fill rolls back the whole cluster stack, so nodes start only when asked for."""
        return self.desired_nodes if self.desired_nodes is not None else self.min_nodes


@dataclass(frozen=True, kw_only=True, slots=True)
class RepairOverride:
    """One NodeRepairConfigOverrides entry (EKS: all four values are required)."""

    condition: str
    reason: str
    action: RepairAction
    wait_minutes: int


def parse_repair_override(entry: str) -> RepairOverride:
    """`Condition:Reason:Action:WaitMinutes` -> RepairOverride, or ConfigError naming the entry."""
    key = "gpu.repair_overrides"
    parts = entry.split(":")
    require(len(parts) == 4, key, f"{entry!r} is not Condition:Reason:Action:WaitMinutes")
    condition, reason, action, wait = parts
    require(
        condition in REPAIR_CONDITIONS,
        key,
        f"{condition!r} in {entry!r} is not a node condition; use one of: " + ", ".join(REPAIR_CONDITIONS),
    )
    require(
        bool(re.match(r"^[A-Za-z0-9]{1,64}$", reason)), key, f"{reason!r} in {entry!r} is not a reason name"
    )
    require(
        action in REPAIR_ACTIONS,
        key,
        f"{action!r} in {entry!r} is not a repair action; use one of: " + ", ".join(REPAIR_ACTIONS),
    )
    require(
        bool(re.match(r"^\d{1,4}$", wait)) and int(wait) >= 1,
        key,
        f"{wait!r} in {entry!r} is not a wait in minutes; use 1 or more",
    )
    return RepairOverride(condition=condition, reason=reason, action=action, wait_minutes=int(wait))  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageConfig:
    """FSx for Lustre (LZ4, encrypted at rest, in the GPU subnet), optionally linked to an S3 bucket."""

    deployment_type: DeploymentType = "PERSISTENT_2"
    """FSx for Lustre deployment type: PERSISTENT_2 (recommended), PERSISTENT_1 or SCRATCH_2 (SSD)."""
    storage_gib: int = 2400
    """Storage capacity in GiB: 1200, or a multiple of 2400. The default with 1000 MB/s/TiB writes a
    llama3.1-8b checkpoint (96 GB) in ~41 s (docs/infra.md, "FSx sizing")."""
    throughput_per_tib: int | None = None
    """Throughput in MB/s per TiB: PERSISTENT_2 125/250/500/1000 (unset: 1000), PERSISTENT_1 50/100/200
    (unset: 200); SCRATCH_2: leave unset (fixed)."""
    efa_enabled: bool = False
    """EFA-enabled file system (PERSISTENT_2 only; GPUDirect Storage clients); set only at creation
    (changing it replaces the file system). Adds the EFA security group to the file system and opens the
    file system's own group to all traffic within itself (FSx guide, EFA-enabled file systems)."""
    checkpoint_gb: int = 97
    """Size of one full checkpoint in GB that the file system must absorb (llama3.1-8b: 8.03e9 params x 12
    bytes = 96.4 GB)."""
    checkpoint_write_s: int = 120
    """Longest acceptable write of one checkpoint, seconds (1 .. 3600; keep below the checkpoint interval);
    sizes that cannot meet it are refused with the smallest size that can."""
    s3_bucket: str | None = None
    """Existing S3 bucket to link at /data (auto import and export); unset for no link."""

    def __post_init__(self) -> None:
        gib = self.storage_gib
        require(
            gib == 1200 or (gib > 0 and gib % 2400 == 0),
            "storage.storage_gib",
            f"{gib} is not allowed for {self.deployment_type}; use 1200 or a multiple of 2400",
        )
        allowed = FSX_THROUGHPUT_PER_TIB[self.deployment_type]
        if self.throughput_per_tib is not None:
            require(
                bool(allowed),
                "storage.throughput_per_tib",
                f"{self.throughput_per_tib} is not allowed for SCRATCH_2 (fixed throughput); unset it",
            )
            require(
                self.throughput_per_tib in allowed,
                "storage.throughput_per_tib",
                f"{self.throughput_per_tib} is not allowed for {self.deployment_type}; use one of "
                + ", ".join(map(str, allowed)),
            )
        require(
            not self.efa_enabled or self.deployment_type == "PERSISTENT_2",
            "storage.efa_enabled",
            f"not allowed with {self.deployment_type}; EFA-enabled file systems are PERSISTENT_2 only",
        )
        require(
            self.checkpoint_gb >= 1,
            "storage.checkpoint_gb",
            f"{self.checkpoint_gb} is not allowed; use 1 or more",
        )
        require(
            1 <= self.checkpoint_write_s <= CHECKPOINT_WRITE_S_MAX,
            "storage.checkpoint_write_s",
            f"{self.checkpoint_write_s} is not allowed; use 1 .. {CHECKPOINT_WRITE_S_MAX} seconds",
        )
        if self.s3_bucket is not None:
            require(
                bool(_BUCKET_RE.match(self.s3_bucket)),
                "storage.s3_bucket",
                f"{self.s3_bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.', '-')",
            )

    @property
    def effective_throughput_per_tib(self) -> int | None:
        """Throughput actually requested (the type's default when unset); None for SCRATCH_2."""
        if self.throughput_per_tib is not None:
            return self.throughput_per_tib
        return FSX_DEFAULT_THROUGHPUT_PER_TIB[self.deployment_type]


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistryConfig:
    """The ECR repository for the trainer image."""

    repository: str = "trainer"
    """Repository name under the prefix: the image lives at `<prefix>/<repository>`."""
    keep_images: int = 30
    """Tagged images kept by the lifecycle rule (older ones expire; untagged images expire after 7 days)."""

    def __post_init__(self) -> None:
        require(
            bool(_DNS_LABEL_RE.match(self.repository)),
            "registry.repository",
            f"{self.repository!r} is not allowed; use lowercase letters, digits and '-'",
        )
        require(
            self.keep_images >= 1, "registry.keep_images", f"{self.keep_images} is not allowed; use 1 or more"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class KubernetesConfig:
    """Kubernetes objects CDK can install: NVIDIA and EFA device plugins (Helm), the FSx PV/PVC, and (off by
    default) the JobSet and Kubeflow Trainer controllers (Helm)."""

    deploy_objects: bool = True
    """Install the device plugins and the FSx PV/PVC with CDK (adds the kubectl provider: two Lambdas,
    ~57 MB of assets); false: no Lambdas, `make train-job` applies the PV/PVC."""
    namespace: str = "default"
    """Namespace of the FSx PVC (the training Job's namespace)."""
    nvidia_device_plugin_version: str = "0.20.0"
    """Pinned `nvidia-device-plugin` chart version (https://nvidia.github.io/k8s-device-plugin)."""
    efa_device_plugin_version: str = "v0.5.32"
    """Pinned `aws-efa-k8s-device-plugin` chart version (https://aws.github.io/eks-charts); 0.5.10 or
    newer."""
    job_controllers: bool = False
    """Install JobSet and Kubeflow Trainer (Helm charts pinned by the two versions that follow), the
    controllers of the training job's `KIND=jobset` and `KIND=trainjob` (docs/k8s.md); needs
    `kubernetes.deploy_objects`. Off: `KIND=job` needs no controller."""
    jobset_chart_version: str = "0.12.0"
    """Pinned `jobset` chart version (oci://registry.k8s.io/jobset/charts/jobset; JobSet v0.12.0)."""
    trainer_chart_version: str = "2.3.0"
    """Pinned `kubeflow-trainer` chart version (oci://ghcr.io/kubeflow/charts/kubeflow-trainer; Kubeflow
    Trainer v2.3.0, whose chart depends on jobset 0.12.0)."""

    def __post_init__(self) -> None:
        require(
            bool(_DNS_LABEL_RE.match(self.namespace)),
            "kubernetes.namespace",
            f"{self.namespace!r} is not a DNS-1123 label",
        )
        for key, value in (
            ("kubernetes.nvidia_device_plugin_version", self.nvidia_device_plugin_version),
            ("kubernetes.efa_device_plugin_version", self.efa_device_plugin_version),
            ("kubernetes.jobset_chart_version", self.jobset_chart_version),
            ("kubernetes.trainer_chart_version", self.trainer_chart_version),
        ):
            require(
                bool(_CHART_VERSION_RE.match(value)), key, f"{value!r} is not a chart version like '1.2.3'"
            )
        require(
            self.deploy_objects or not self.job_controllers,
            "kubernetes.job_controllers",
            "the JobSet and Trainer charts are installed through the kubectl provider; set "
            "kubernetes.deploy_objects=true too, or install the controllers yourself (docs/k8s.md)",
        )


_ALARMS = AlarmThresholds()
_EMAIL_RE = re.compile(r"^[^@\s,;]+@[^@\s,;]+\.[A-Za-z]{2,}$")
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)
"""Retention values CloudWatch Logs accepts (PutRetentionPolicy)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MonitoringConfig:
    """The training dashboard, alarms and their SNS topic, over the live metrics the trainer and launcher emit
    (training/contracts/metrics_catalog.py; docs/metrics.md says what to do for each alarm)."""

    enabled: bool = True
    """Create the dashboard, the alarms, the SNS topic and the metrics log group."""
    alarm_emails: tuple[str, ...] = ()
    """Email addresses subscribed to the alarm topic (each confirms by mail); empty: the topic has none."""
    no_progress_minutes: int = _ALARMS.no_progress_minutes
    """Alarm when a running job has finished no step for this many minutes (1-1440)."""
    stale_checkpoint_intervals: int = _ALARMS.stale_checkpoint_intervals
    """Alarm when the last committed checkpoint is older than this many checkpoint intervals (2-100)."""
    restarts_left_alarm: int = _ALARMS.restarts_left_alarm
    """Alarm when a launcher's restart budget left falls to this many or fewer (0-100)."""
    goodput_min_percent: int = _ALARMS.goodput_min_percent
    """Alarm when a job's goodput so far stays below this percentage (1-99)..."""
    goodput_minutes: int = _ALARMS.goodput_minutes
    """...for this many minutes (5-1440): a job's first minutes (start-up, first load) are not a fault."""
    no_spare_alarm: bool = _ALARMS.no_spare_alarm
    """Alarm when a job that started with hot spares has none left waiting."""
    log_retention_days: int = 30
    """Retention of the log group that holds the metric records (a CloudWatch Logs retention value)."""

    def __post_init__(self) -> None:
        for email in self.alarm_emails:
            require(
                bool(_EMAIL_RE.match(email)),
                "monitoring.alarm_emails",
                f"{email!r} is not an email address like 'oncall@example.com'",
            )
        require(
            len(set(self.alarm_emails)) == len(self.alarm_emails),
            "monitoring.alarm_emails",
            "an address is given twice; list each once",
        )
        for key, value, lo, hi in (
            ("monitoring.no_progress_minutes", self.no_progress_minutes, 1, 1440),
            ("monitoring.stale_checkpoint_intervals", self.stale_checkpoint_intervals, 2, 100),
            ("monitoring.restarts_left_alarm", self.restarts_left_alarm, 0, 100),
            ("monitoring.goodput_min_percent", self.goodput_min_percent, 1, 99),
            ("monitoring.goodput_minutes", self.goodput_minutes, 5, 1440),
        ):
            require(lo <= value <= hi, key, f"{value} is not allowed; use {lo} to {hi}")
        require(
            self.log_retention_days in LOG_RETENTION_DAYS,
            "monitoring.log_retention_days",
            f"{self.log_retention_days} is not a CloudWatch Logs retention; use one of "
            + ", ".join(map(str, LOG_RETENTION_DAYS)),
        )

    @property
    def thresholds(self) -> AlarmThresholds:
        """The alarm thresholds, for `fsdpkit.contracts.metrics_catalog.alarm_rules`."""
        return AlarmThresholds(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AlarmThresholds)})
