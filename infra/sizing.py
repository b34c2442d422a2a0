"""How long one full checkpoint takes to write to FSx for Lustre: arithmetic for validation and docs.

FSx for Lustre SSD throughput is per TiB of storage
(https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html):
PERSISTENT_2/1 the chosen MB/s per TiB, SCRATCH_2 200 MB/s per TiB baseline. A sharded (FSDP) checkpoint is
written by every node at once, so the file system's aggregate throughput bounds the write unless the nodes'
own network is smaller (nodes x per-client bandwidth).
"""

from __future__ import annotations

import math

SCRATCH_2_MBPS_PER_TIB = 200
"""SCRATCH_2 baseline disk/network throughput per TiB (FSx performance page)."""
CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights (4) + two AdamW moments (8): what one full checkpoint holds per parameter."""
DEFAULT_MODEL_PARAMS = 8.03e9
"""llama3.1-8b, the kit's default model on p5 (k8s profiles)."""
CLIENT_MBPS = 12_500
"""One p5 node's ENA bandwidth on network card 0 (100 Gbps), the path a non-EFA Lustre client uses."""


def checkpoint_gb(params: float) -> float:
    """Full checkpoint size in GB (10^9 bytes) for a model of `params` parameters."""
    return params * CHECKPOINT_BYTES_PER_PARAM / 1e9


def fsx_mbps(storage_gib: int, throughput_per_tib: int) -> float:
    """Aggregate FSx throughput in MB/s for `storage_gib` at `throughput_per_tib` MB/s per TiB."""
    return storage_gib / 1024 * throughput_per_tib


def write_seconds(
    *, checkpoint_gb: float, fs_mbps: float, nodes: int, client_mbps: float = CLIENT_MBPS
) -> float:
    """Seconds to write one checkpoint from `nodes` nodes in parallel: the slower of FSx and the clients."""
    return checkpoint_gb * 1000 / min(fs_mbps, nodes * client_mbps)


def smallest_storage_gib(*, checkpoint_gb: float, budget_s: float, throughput_per_tib: int) -> int:
    """Smallest valid FSx size (1200 or a multiple of 2400 GiB) writing `checkpoint_gb` within `budget_s`."""
    need_tib = checkpoint_gb * 1000 / budget_s / throughput_per_tib
    if need_tib * 1024 <= 1200:
        return 1200
    return 2400 * math.ceil(need_tib * 1024 / 2400)
