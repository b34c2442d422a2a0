"""Storage stack: FSx for Lustre next to the GPU nodes."""

from __future__ import annotations

from constructs import Construct

from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.constructs.network import Network
from fsdpkit.infra.constructs.storage import Storage
from fsdpkit.infra.stacks.base import KitStack


class StorageStack(KitStack):
    """FSx for Lustre in the GPU subnet, reachable from the EFA security group."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: KitConfig, network: Network) -> None:
        super().__init__(
            scope, construct_id, cfg=cfg, suffix="storage", description="FSDP kit: FSx for Lustre"
        )
        self.storage = Storage(
            self,
            "Storage",
            cfg=cfg.storage,
            vpc=network.vpc,
            subnet=network.private_subnet_in(cfg.gpu.availability_zone),
            client_security_group=network.efa_security_group,
        )
