"""The save that may still run in the background, and every wait of the training thread on it.

Each wait runs inside `on_wait()` (the trainer passes its heartbeat's "checkpoint" phase), so a slow save
never looks like a hang; the waits that block the loop are timed as `ckpt` events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from fsdpkit.resilience.checkpoint.guard import SaveGuard
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("fsdpkit.resilience.checkpoint")

OnWait = Callable[[], AbstractContextManager[object]]


@dataclass
class InflightSave:
    """One save from request to commit."""

    step: int
    t_request: float
    guard: SaveGuard
    staged: threading.Event = field(default_factory=threading.Event)
    """Set once the host copy is complete (immediately in sync mode)."""
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False

    def end(self) -> None:
        """The save is over (committed or failed): nothing waits on it any more."""
        self.staged.set()
        self.done.set()
        self.guard.held.set()  # a save that never reached its test hold will not reach it now


class SaveSlot:
    """The latest save handed to the background (None before the first, and always in sync mode)."""

    def __init__(self, events: EventLog, on_wait: OnWait) -> None:
        self.current: InflightSave | None = None
        self._events = events
        self._on_wait = on_wait
        self._busy_waits = 0

    def writing(self) -> bool:
        """A save's background part is still running."""
        return self.current is not None and not self.current.done.is_set()

    def wait_previous(self, step: int) -> None:
        """Step `step` is due while the previous save is still written: wait for it (stall), and say once
        how to avoid it; skipping would silently double the lost work the interval bounds."""
        prev = self.current
        if prev is None or prev.done.is_set():
            return
        t0 = time.perf_counter()
        with self._on_wait():
            prev.done.wait()
        self._busy_waits += 1
        if self._busy_waits == 1:
            log.warning(
                "checkpoint of step %d was still being written when step %d came due; waited %.2fs, "
                "counted as stall (raise checkpoint.interval or use faster storage)",
                prev.step,
                step,
                time.perf_counter() - t0,
            )

    def wait_staged(self) -> None:
        """Block (a timed stall) until the host copy of the current save is done: the state may change."""
        save = self.current
        if save is None or save.staged.is_set():
            return
        t0 = time.time()
        t0p = time.perf_counter()
        with self._on_wait():
            save.staged.wait()
        self._events.emit(
            "ckpt",
            step=save.step,
            phase="stall",
            duration_s=time.perf_counter() - t0p,
            ts=t0,
            waited="staging",
        )

    def wait_staged_untimed(self) -> None:
        """Block until the host copy is done or abandoned (a local memcpy: always finishes), untimed."""
        save = self.current
        if save is not None:
            with self._on_wait():
                save.staged.wait()

    def drain(self) -> None:
        """Block until the current save is committed or failed (a `drain` event times it)."""
        save = self.current
        if save is None or save.done.is_set():
            return
        t0 = time.time()
        t0p = time.perf_counter()
        with self._on_wait():
            save.done.wait()
        self._events.emit("ckpt", step=save.step, phase="drain", duration_s=time.perf_counter() - t0p, ts=t0)
