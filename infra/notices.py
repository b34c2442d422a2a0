"""Lines the app prints at synth time: what GPU capacity the user gets, and Kubernetes support status."""

from __future__ import annotations

import datetime as dt

from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.kubernetes_versions import support_notice

_CAPACITY = {
    "on_demand": "on demand, no reservation",
    "odcr": "from the On-Demand Capacity Reservation",
    "capacity_block": "from the Capacity Block",
}

_START_HINT = {
    "on_demand": "",
    "odcr": " (N at most the reservation's instance count, once it is active in gpu.availability_zone)",
    "capacity_block": " (once the block is active)",
}


def capacity_line(cfg: KitConfig) -> str:
    """One line: how many GPU nodes the deploy asks for, from where, and how to change it."""
    gpu = cfg.gpu
    nodes = gpu.effective_desired_nodes
    how = "set" if gpu.desired_nodes is not None else "default"
    line = (
        f"gpu: {nodes} x {gpu.instance_type} ({how}; max {gpu.max_nodes}, {_CAPACITY[gpu.capacity]}); "
        "cluster, FSx and ECR deploy either way"
    )
    if nodes == 0:
        line += "; start nodes with -c gpu.desired_nodes=N" + _START_HINT[gpu.capacity]
    return line


def synth_notices(cfg: KitConfig, today: dt.date) -> list[str]:
    """Every synth-time line, in print order."""
    lines = [capacity_line(cfg)]
    version = support_notice(cfg.cluster.kubernetes_version, today)
    if version is not None:
        lines.append(version)
    return lines
