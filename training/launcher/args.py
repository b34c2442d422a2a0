"""The launcher's checked command line: what `cli.parse_args` makes and `runner.run` reads (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fsdpkit.contracts.metrics_settings import MetricsSettings


@dataclass(frozen=True, kw_only=True)
class LaunchArgs:
    """The checked command line."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    node_rank: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    rdzv_configs: dict[str, str]
    max_restarts: int
    monitor_interval: float
    log_dir: str | None
    run_dir: str | None
    heartbeat_timeout_s: float | None
    heartbeat_load_timeout_s: float
    heartbeat_safety_factor: float
    heartbeat_min_timeout_s: float
    hang_interrupt_grace_s: float
    zygote: bool
    shutdown_timeout: int
    spares: int
    node_failure_limit: int
    node_failure_window_s: float
    entrypoint: str
    argv: list[str]
    target_kind: Literal["module", "script", "program"]
    target: str
    """What every worker runs (`-m` module, script path, or program), checked before any worker starts."""
    rank_restart: Literal["group", "in-place"] = "group"
    """in-place: a crashed worker is started again alone (launcher/shim.py) and rejoins its peers."""
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    """Where the launcher's live metrics go (fsdpkit.contracts.metrics_settings: the pod's environment)."""
