"""Whether a save may go on: abandonment (in-process restart) and the test-only hooks that slow or hold it.

A save runs on its checkpointer's process group. After an in-process restart that group is aborted; a save
still running in the background must then stop, not carry on without its group (DCP would silently fall
back to one process: torch 2.13 `dcp.save` turns `no_dist` on when no default group exists). Every phase
of a save passes `SaveGuard.point(phase)`, which raises `SaveAbandoned` once the checkpointer was
abandoned, so an abandoned save never stages, writes or commits again; the writer checks it per item too.

Test hooks (never set in production):
  KIT_CKPT_TEST_DELAY_S   seconds the background writer sleeps before copying each tensor and before
                          writing each item, so tests can keep a save in flight;
  KIT_CKPT_TEST_HOLD      `PHASE@STEP[,PHASE@STEP...]`, PHASE one of staging, writing, committing: the save
                          of STEP stops at the start of PHASE (on every rank that has it; committing is rank
                          0's) until it is abandoned or its process dies, and `maybe_save` returns only once
                          it is held, so a fault at the top of the next step lands in that phase. Each hold
                          happens once per run and rank (a marker under `<run_dir>/test_holds/`), like a
                          fault; a step listed with several phases is held at the first unused one each
                          time it is saved (e.g. `staging@2,writing@2`: the first save of step 2 is held
                          in staging, the next one, after a restart, in writing).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger("fsdpkit.resilience.checkpoint")

Phase = Literal["staging", "writing", "committing"]
PHASES: tuple[str, ...] = ("staging", "writing", "committing")
TEST_DELAY_ENV = "KIT_CKPT_TEST_DELAY_S"
TEST_HOLD_ENV = "KIT_CKPT_TEST_HOLD"
HOLDS_DIR = "test_holds"
HOLD_LIMIT_S = 120.0
"""A held save goes on after this long (a guard for a test whose fault never came)."""


class SaveAbandoned(RuntimeError):
    """The save's checkpointer was abandoned (its process group is gone); the save stops here."""


def test_delay_s() -> float:
    """The test-only per-item delay of the background writer (0 unless KIT_CKPT_TEST_DELAY_S is set)."""
    return float(os.environ.get(TEST_DELAY_ENV, "0") or 0)


def test_holds() -> dict[int, list[str]]:
    """Step -> phases (in order) from KIT_CKPT_TEST_HOLD; ValueError (one line) for a malformed value."""
    spec = os.environ.get(TEST_HOLD_ENV, "").strip()
    holds: dict[int, list[str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        phase, _, step = item.partition("@")
        if phase not in PHASES or not step.isdigit():
            raise ValueError(
                f"{TEST_HOLD_ENV} item {item!r}: expected PHASE@STEP with PHASE one of {', '.join(PHASES)}"
            )
        holds.setdefault(int(step), []).append(phase)
    return holds


@dataclass
class SaveGuard:
    """Whether one save may go on: `point(phase)` at the start of each phase, `check()` in loops."""

    step: int
    abandoned: threading.Event
    """Shared by every save of one checkpointer; set by `Checkpointer.abandon()`."""
    hold: str | None = None
    """The phase this save is held at (test hook), or None."""
    held: threading.Event = field(default_factory=threading.Event)
    """Set once the save reached its hold, or ended without reaching it."""

    def check(self) -> None:
        if self.abandoned.is_set():
            raise SaveAbandoned(
                f"save of step {self.step} abandoned: an in-process restart aborted its process group"
            )

    def point(self, phase: str) -> None:
        """Start of `phase`: stop if abandoned; wait here if this is the save's test hold."""
        self.check()
        if phase != self.hold:
            return
        self.held.set()
        if not self.abandoned.wait(HOLD_LIMIT_S):
            log.warning("test hold of step %d at %s: released after %.0f s", self.step, phase, HOLD_LIMIT_S)
        self.check()


class SaveHolds:
    """Which saves to hold (KIT_CKPT_TEST_HOLD), each once per run and rank."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self._holds = test_holds()
        self._dir = Path(run_dir) / HOLDS_DIR
        self._rank = rank

    def claim(self, step: int) -> str | None:
        """The phase to hold the save of `step` at: its first hold not yet used in this run, if any."""
        for phase in self._holds.get(step, []):
            self._dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self._dir / f"{phase}-step{step}-rank{self._rank}", os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                continue
            os.close(fd)
            return phase
        return None
