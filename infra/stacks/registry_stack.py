"""Registry stack: the ECR repository for the trainer image."""

from __future__ import annotations

from constructs import Construct

from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.constructs.registry import Registry
from fsdpkit.infra.stacks.base import KitStack


class RegistryStack(KitStack):
    """ECR repository `<prefix>/<registry.repository>`."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: KitConfig) -> None:
        super().__init__(
            scope, construct_id, cfg=cfg, suffix="registry", description="FSDP kit: ECR repository"
        )
        self.registry = Registry(self, "Registry", cfg=cfg.registry, prefix=cfg.prefix)
