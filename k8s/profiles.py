"""Instance profiles: what one node of each supported instance type offers a training pod.

A profile is data, not logic: the values model (`fsdpkit.k8s.values`) reads it to fill defaults and to check
that a
request matches the hardware; templates never see it directly. Figures are per node. CPU and memory are what
the pod requests (requests = limits, Guaranteed QoS), which leaves headroom below the instance's total for
the kubelet, system reserve and the device-plugin / CSI DaemonSets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

ProfileName = Literal["p5", "p4d", "g5", "local"]

# NCCL / libfabric settings shared by every EFA profile. Sources: the study's manifests
# (reference/seed-system.md section 4), aws-ofi-nccl and EFA docs, NVRx's in-process guide (section 14.6).
_EFA_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_FORK_SAFE": "1",
    "RDMAV_FORK_SAFE": "1",
    "FI_LOG_LEVEL": "warn",
    # pod-id-link0 is EKS Pod Identity's link-local interface: a socket fallback that picks it hangs
    # cross-node (aws-samples/aws-do-eks#54).
    "NCCL_SOCKET_IFNAME": "^docker,lo,veth,pod-id-link0",
    "NCCL_BUFFSIZE": "8388608",
    "NCCL_P2P_NET_CHUNKSIZE": "2097152",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    # aws-ofi-nccl's tuner picks NCCL algorithms and protocols for EFA (the study's manifests set it).
    "NCCL_TUNER_PLUGIN": "/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so",
}
_RDMA_ENV: dict[str, str] = {
    # GPUDirect RDMA over EFA, only where the instance supports it (p4d, p5; not g5): the study's Dockerfile
    # asks for FI_EFA_USE_DEVICE_RDMA (no manifest set it, bug 8) and its manifests set GDR level 5 (SYS).
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "NCCL_NET_GDR_LEVEL": "5",
}


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One node type. Immutable; looked up by name with `get_profile`."""

    name: ProfileName
    instance_type: str
    """EC2 instance type the GPU node group must run (checked against the stack output GpuInstanceType)."""
    instance_family: tuple[str, ...]
    """Instance types that map to this profile when read from the stack outputs."""
    gpus: int
    """GPUs per node (`nvidia.com/gpu`); 0 for the CPU profile."""
    efa: int
    """EFA devices per node (`vpc.amazonaws.com/efa`)."""
    cpu: int
    """vCPUs the pod requests (= limit)."""
    memory_gib: int
    """Memory the pod requests (= limit), GiB; the memory-backed /dev/shm counts against it."""
    shm_min_gib: int
    """Smallest /dev/shm the kit mounts; the values model raises it to fit async checkpoint staging."""
    default_model: str
    """Model used when MODEL is not given."""
    gpu_memory_mib: int = 0
    """Memory of one GPU as the driver reports it (nvidia-smi), MiB; 0 for the CPU profile. The memory plan
    checks the job against it at render time."""
    seq_len: int | None = None
    """Default data.seq_len of this profile's jobs (None: the trainer's default)."""
    batch_size: int | None = None
    """Default data.batch_size (micro-batch per rank) of this profile's jobs."""
    activation_checkpointing: Literal["none", "selective", "full"] | None = None
    """Default model.activation_checkpointing of this profile's jobs."""
    checkpoint_interval: int | Literal["auto"] | None = None
    """Default checkpoint.interval of this profile's jobs when CHECKPOINT_INTERVAL is not given (None: the
    trainer's fixed default, contracts.defaults.CHECKPOINT_INTERVAL, which suits CPU runs). auto on the GPU
    profiles: the run picks Young/Daly's optimum from its own save cost, step time and faults, as `make plan`
    does from projections; a fixed default would cost a large job goodput the plan then warns about."""
    backend: Literal["nccl", "gloo"]
    """Collective backend the trainer picks on this hardware (informational; the trainer decides)."""
    requires_image: bool
    """EKS profiles need a real image; the local runner does not use one."""
    env: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Environment every pod of this profile gets (NCCL / libfabric); users may override these names."""


def _env(**extra: str) -> MappingProxyType[str, str]:
    return MappingProxyType({**_EFA_ENV, **extra})


PROFILES: MappingProxyType[str, Profile] = MappingProxyType(
    {
        # p5.48xlarge: 8x H100 80 GB, 32 EFA (3,200 Gbps), 192 vCPU, 2,048 GiB. GPUDirect RDMA over EFA:
        # FI_EFA_USE_DEVICE_RDMA=1 (the study's Dockerfile asks for it; no manifest set it, bug 8).
        "p5": Profile(
            name="p5",
            instance_type="p5.48xlarge",
            instance_family=("p5.48xlarge",),
            gpus=8,
            efa=32,
            cpu=176,
            memory_gib=1800,
            shm_min_gib=64,
            default_model="llama3.1-8b",
            # H100 80GB HBM3. Llama-3.1-8B at its 8K context, micro-batch 1, full activation checkpointing:
            # 31 GiB per GPU on 2 nodes by the plan (docs/training.md); selective fits too (59 GiB).
            gpu_memory_mib=81559,
            seq_len=8192,
            batch_size=1,
            activation_checkpointing="full",
            checkpoint_interval="auto",
            backend="nccl",
            requires_image=True,
            env=_env(**_RDMA_ENV),
        ),
        # p4d.24xlarge / p4de.24xlarge: 8x A100, 4 EFA (400 Gbps), 96 vCPU, 1,152 GiB; RDMA read supported.
        "p4d": Profile(
            name="p4d",
            instance_type="p4d.24xlarge",
            instance_family=("p4d.24xlarge", "p4de.24xlarge"),
            gpus=8,
            efa=4,
            cpu=88,
            memory_gib=1000,
            shm_min_gib=64,
            default_model="llama3.1-8b",
            gpu_memory_mib=40960,  # A100-SXM4-40GB (p4de's 80 GB GPUs get the same, safe, figure)
            seq_len=4096,
            batch_size=1,
            activation_checkpointing="full",
            checkpoint_interval="auto",
            backend="nccl",
            requires_image=True,
            env=_env(**_RDMA_ENV),
        ),
        # g5.8xlarge: 1x A10G 24 GB, 1 EFA (no GPUDirect RDMA), 32 vCPU, 128 GiB: the cheap test node.
        "g5": Profile(
            name="g5",
            instance_type="g5.8xlarge",
            instance_family=("g5.8xlarge",),
            gpus=1,
            efa=1,
            cpu=28,
            memory_gib=112,
            shm_min_gib=8,
            default_model="small",
            gpu_memory_mib=23028,  # A10G 24 GB
            checkpoint_interval="auto",
            backend="nccl",
            requires_image=True,
            env=_env(),
        ),
        # local: CPU processes on this machine (the local runner); also renders and validates like the others.
        "local": Profile(
            name="local",
            instance_type="local",
            instance_family=(),
            gpus=0,
            efa=0,
            cpu=1,
            memory_gib=4,
            shm_min_gib=1,
            default_model="tiny",
            backend="gloo",
            requires_image=False,
        ),
    }
)


def get_profile(name: str) -> Profile:
    """The profile called `name`; a ValueError names the valid ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile={name!r} is unknown; use one of {', '.join(PROFILES)}") from None


def profile_for_instance(instance_type: str) -> Profile:
    """The profile whose instance family contains `instance_type` (from the stack output GpuInstanceType)."""
    for profile in PROFILES.values():
        if instance_type in profile.instance_family:
            return profile
    known = ", ".join(t for p in PROFILES.values() for t in p.instance_family)
    raise ValueError(
        f"GpuInstanceType={instance_type!r} has no k8s profile; supported instance types: {known}"
    )
