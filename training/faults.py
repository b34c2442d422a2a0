"""Fault injection (design, contract 5) (owner: launcher work). STUB: interface final, body not.

Grammar (CLI, values file, benchmarks): a comma-separated list of `KIND:step=N:rank=R` or
`KIND:time=SECONDS:rank=R`; KIND is kill | hang | sigstop | exception | oom. Example:
`kill:step=20:rank=1,exception:step=45:rank=1`. A seeded schedule like the study's is configured by
FaultConfig.schedule_* fields (never rank 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from training.events import EventLog


@dataclass(kw_only=True)
class FaultConfig:
    spec: str = ""
    """Explicit faults, e.g. "kill:step=20:rank=1,hang:time=30:rank=1"; empty means none."""
    schedule_seed: int | None = None
    """Seed of the study's random schedule; None disables it."""
    schedule_count: int = 5
    """Number of scheduled faults."""
    schedule_kinds: str = "exception:0.6,hang:0.4"
    """Kinds with weights for the scheduled faults."""
    schedule_after_step: int = 10
    """Scheduled faults fall strictly after this step."""


class FaultInjector:
    """Applies the faults meant for this rank; faults already passed (the run resumed past them) never fire again."""

    def __init__(self, cfg: FaultConfig, *, rank: int, world_size: int, max_steps: int, events: EventLog) -> None:
        self.cfg = cfg

    def maybe_inject(self, step: int) -> None:
        """Called at the top of every training step; acts when a fault for (step, this rank) is due."""

    def close(self) -> None:
        """Stops the timer of time-based faults."""
