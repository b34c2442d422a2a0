"""What the kit's rendezvous takes from the launcher's flags, and the limits that follow from them."""

from __future__ import annotations

from dataclasses import dataclass

VERDICT_STALLS = 3.0
VERDICT_BEATS = 3
"""A silent node is gone once its last beat is older than VERDICT_STALLS x the larger of its own recent stall
and the load now (the leader's own beat gaps of the last LOAD_WINDOW_S, the joiners' median stall), and at
least VERDICT_BEATS beats, never later than the expiry (Settings.verdict_s)."""


@dataclass(frozen=True)
class Settings:
    """What the handler needs from the launcher's flags (validated there, training/launcher/cli.py)."""

    run_id: str
    min_nodes: int
    max_nodes: int
    beat_s: float = 0.1
    attempts: int = 12
    join_timeout_s: float = 600.0
    last_call_s: float = 30.0
    spare: bool = False
    substitute: bool = False
    """`--rank-restart in-place`: a newcomer (a hot spare, the Job's replacement pod) takes a lost node's
    place in the running round, and its workers rejoin the survivors' (KitRendezvous: substitution)."""
    """A hot spare by index (--node-rank >= NNODES): it waits for the first round, then in the pool."""

    @property
    def expiry_s(self) -> float:
        return self.beat_s * self.attempts

    def verdict_s(self, stall_s: float) -> float:
        """How old a silent node's last beat may be before it is gone: VERDICT_STALLS x the longest gap it
        saw between its own beats lately (a quiet host: ~0.1 s -> 0.36 s; one whose beats stall under load
        waits longer), at least VERDICT_BEATS beats, at most the expiry (interval x attempts)."""
        return min(self.expiry_s, max(VERDICT_BEATS * self.beat_s, VERDICT_STALLS * stall_s))

    @property
    def invite_timeout_s(self) -> float:
        """An invited node that has not joined after this long is passed over for another."""
        return max(2.0 * self.expiry_s, 2.0)
