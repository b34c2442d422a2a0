"""Network stack: VPC and EFA security group."""

from __future__ import annotations

from constructs import Construct

from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.constructs.network import Network
from fsdpkit.infra.stacks.base import KitStack


class NetworkStack(KitStack):
    """VPC over the configured AZs and the EFA security group (shared by storage and cluster)."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: KitConfig) -> None:
        super().__init__(
            scope, construct_id, cfg=cfg, suffix="network", description="FSDP kit: VPC and EFA security group"
        )
        self.network = Network(self, "Network", cfg=cfg.network)
        self.gpu_subnet = self.network.private_subnet_in(cfg.gpu.availability_zone)
