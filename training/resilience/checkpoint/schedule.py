"""When to save: every `interval` steps, or with `interval: auto` the interval rank 0 chooses from its
measurements (fsdpkit.resilience.checkpoint.interval: Young/Daly).

Rank 0's choice rides on train_step's loss all-reduce (`proposal` / `agree`), so every rank saves at the
same steps without a collective of its own.
"""

from __future__ import annotations

import os

from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.interval import AutoInterval
from fsdpkit.runtime.events import EventLog


class SaveSchedule:
    """Decides which steps save; `last_step` is the step last saved or restored."""

    def __init__(self, cfg: CheckpointConfig, *, world_size: int, auto: AutoInterval | None = None) -> None:
        self.cfg = cfg
        self.world_size = world_size
        self.auto = auto
        self.last_step: int | None = None
        """A second save of it is skipped; `auto` counts from it."""

    @classmethod
    def from_config(
        cls,
        cfg: CheckpointConfig,
        *,
        run_dir: str | os.PathLike[str],
        rank: int,
        world_size: int,
        events: EventLog,
        live: bool,
    ) -> SaveSchedule:
        """`live`: the run resumes from the live state of the last session (not a fault for `auto`)."""
        auto = (
            AutoInterval(cfg, run_dir=run_dir, rank=rank, events=events, live=live)
            if cfg.auto and cfg.mode != "off"
            else None
        )
        return cls(cfg, world_size=world_size, auto=auto)

    def due(self, step: int) -> bool:
        """Every `interval` steps (step % interval == 0), or with `auto` once the agreed interval has passed
        since the last save or restore (the same on every rank)."""
        if self.cfg.mode == "off":
            return False
        if self.auto is None:
            return step % self.cfg.interval == 0
        if self.last_step is None:  # a fresh start, or restored by another (the previous) checkpointer
            self.last_step = step - 1
        return step - self.last_step >= self.auto.current(self.world_size)

    def proposal(self) -> float | None:
        """With `auto`: this rank's share of the interval all-reduce (SUM); None with a fixed interval."""
        return self.auto.proposal() if self.auto is not None else None

    def agree(self, value: float) -> None:
        """The all-reduced interval (rank 0's choice): `due` uses it from now on."""
        if self.auto is not None:
            self.auto.agree(value)

    @property
    def measures(self) -> bool:
        """Whether `observe` wants the `maybe_save` calls (only `auto` learns from them)."""
        return self.auto is not None

    def observe(
        self, step: int, *, entered: float, left: float, saved: bool, busy: bool, writing: bool
    ) -> None:
        """One `maybe_save` call, for `auto`'s measurements (see AutoInterval.observe)."""
        if self.auto is not None:
            self.auto.observe(step, entered=entered, left=left, saved=saved, busy=busy, writing=writing)
