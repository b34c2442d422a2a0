"""The optimizer hook of async saves: no later update may leak into a checkpoint whose host copy runs.

A global `torch.optim` step pre-hook, so every optimizer in the process waits, while forward and backward
still overlap the copy.
"""

from __future__ import annotations

from typing import Any

from torch.optim.optimizer import register_optimizer_step_pre_hook

from fsdpkit.resilience.checkpoint.inflight import SaveSlot


class StagingGate:
    """Holds each optimizer step until the host copy of the in-flight save is done; `remove()` at close."""

    def __init__(self, slot: SaveSlot) -> None:
        self._slot = slot
        self._handle: Any = register_optimizer_step_pre_hook(self._before_optimizer_step)

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._slot.wait_staged()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
