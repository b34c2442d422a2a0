"""Worker-side heartbeat client (owner: launcher work). STUB: the interface is final, the body is not.

Protocol: the kit's launcher sets KIT_HEARTBEAT_DIR for each worker; the worker writes
`<dir>/rank_<RANK>.json` atomically ({"pid", "step", "phase", "ts"}) on every beat. With no
launcher listening (env unset) every call is a no-op. Under NVRx's ft_launcher the same calls go to
its RankMonitorClient.
"""

from __future__ import annotations

from typing import Literal

Phase = Literal["start", "load", "train", "checkpoint", "done"]


class HeartbeatClient:
    @classmethod
    def from_env(cls) -> HeartbeatClient:
        return cls()

    def phase(self, phase: Phase) -> None:
        """Announce a phase with its own allowance (e.g. "load" while a checkpoint is read)."""

    def beat(self, step: int) -> None:
        """One beat per training step; cheap (one small file write)."""

    def close(self) -> None:
        """Final beat with phase "done"; later silence is not a hang."""
