"""The agent's restart budget, as its collaborators see it: what is left, and spending it all at once."""

from __future__ import annotations

from typing import Any, Protocol

from fsdpkit.runtime import torch_internals as internals


class RestartBudget(Protocol):
    def remaining(self) -> int: ...

    def spend(self) -> None:
        """Leave no restart: the inherited loop then stops instead of retrying."""


class AgentBudget:
    """A torchelastic agent's budget, which torch keeps in a private attribute
    (training/runtime/torch_internals.py)."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    def remaining(self) -> int:
        return internals.remaining_restarts(self._agent)

    def spend(self) -> None:
        internals.spend_restarts(self._agent)
