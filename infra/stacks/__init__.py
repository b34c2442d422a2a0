"""Stacks that compose the constructs; `build_kit` wires them: Network -> Storage, Registry -> Cluster."""

from fsdpkit.infra.stacks.kit import Kit, build_kit

__all__ = ["Kit", "build_kit"]
