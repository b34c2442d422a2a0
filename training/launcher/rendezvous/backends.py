"""The launcher's rendezvous backends, created through torch's public handler registry."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from fsdpkit.launcher.rendezvous.c10d import create_c10d_handler
from fsdpkit.launcher.rendezvous.kit import BACKEND, create_kit_handler

C10D = "c10d"


def register_backends() -> None:
    """Register "kit" in torch's registry. Safe to call again: torch accepts the same creator twice and
    refuses only another creator under the name (its ValueError names both)."""
    rendezvous_handler_registry.register(BACKEND, create_kit_handler)


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler for `params.backend`, hosting or joining its store now. "c10d" is the kit's adapter
    (torch's registry holds torch's own c10d creator and refuses a second one under that name); every
    other backend comes from the registry: "kit" once registered, torch's "static"."""
    if params.backend == C10D:
        return create_c10d_handler(params)
    register_backends()
    return get_rendezvous_handler(params)
