"""Build every stack of the kit from one validated KitConfig."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.nag import acknowledge_findings
from fsdpkit.infra.stacks.cluster_stack import ClusterStack
from fsdpkit.infra.stacks.network_stack import NetworkStack
from fsdpkit.infra.stacks.registry_stack import RegistryStack
from fsdpkit.infra.stacks.storage_stack import StorageStack


@dataclass(frozen=True, kw_only=True)
class Kit:
    """The stacks, for tests and for app.py."""

    network: NetworkStack
    storage: StorageStack
    registry: RegistryStack
    cluster: ClusterStack

    @property
    def stacks(self) -> list[NetworkStack | StorageStack | RegistryStack | ClusterStack]:
        """In deploy order."""
        return [self.network, self.storage, self.registry, self.cluster]


def build_kit(app: App, cfg: KitConfig) -> Kit:
    """Create the stacks under `app`; with `cfg.nag`, run cdk-nag's AwsSolutions checks at synth."""
    network = NetworkStack(app, f"{cfg.prefix}-network", cfg=cfg)
    storage = StorageStack(app, f"{cfg.prefix}-storage", cfg=cfg, network=network.network)
    registry = RegistryStack(app, f"{cfg.prefix}-registry", cfg=cfg)
    cluster = ClusterStack(
        app,
        f"{cfg.prefix}-cluster",
        cfg=cfg,
        network=network.network,
        storage=storage.storage,
        repository_uri=registry.registry.repository_uri,
    )
    cluster.add_stack_dependency(
        registry, "the EcrRepositoryUri output names the registry stack's repository"
    )
    kit = Kit(network=network, storage=storage, registry=registry, cluster=cluster)
    acknowledge_findings(
        control_plane=cluster.control_plane,
        gpu=cluster.gpu,
        networking=cluster.networking,
        addons=cluster.addons,
    )
    if cfg.nag:
        Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return kit
