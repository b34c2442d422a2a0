"""Synthetic runs for the metrics and report tests, written with the real `fsdpkit.runtime.events.EventLog`.

Timestamps are chosen by the test (the `ts` field), so each expected number can be worked out from the
inputs. Ranks step in lock-step, as FSDP's collectives make them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fsdpkit.runtime.events import EventLog

T0 = 1_700_000_000.0
"""A wall-clock origin for synthetic runs (seconds)."""


@dataclass
class SyntheticRun:
    """Writes a run's events: one EventLog per (role, rank, attempt), as real processes would."""

    run_dir: Path
    world_size: int = 2
    attempt: int = 0
    logs: dict[int, EventLog] = field(default_factory=dict)
    launcher: EventLog | None = None

    def _log(self, role: str, rank: int | None) -> EventLog:
        saved = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(self.attempt)
        try:
            return EventLog(self.run_dir, role=role, rank=rank)  # type: ignore[arg-type]
        finally:
            if saved is None:
                del os.environ["TORCHELASTIC_RESTART_COUNT"]
            else:
                os.environ["TORCHELASTIC_RESTART_COUNT"] = saved

    def start_attempt(
        self,
        attempt: int,
        ts: float,
        *,
        resume_step: int | None,
        ckpt_mode: str = "async",
        resume_ts: float | None = None,
    ) -> None:
        """New worker processes: `start` then `resume` on every rank."""
        self.close_workers()
        self.attempt = attempt
        self.launcher = self.launcher or self._log("launcher", None)
        for rank in range(self.world_size):
            log = self._log("trainer", rank)
            self.logs[rank] = log
            log.emit("start", ts=ts, world_size=self.world_size, model="tiny", ckpt_mode=ckpt_mode)
            source = "none" if resume_step is None else "shared"
            log.emit(
                "resume",
                ts=resume_ts or ts,
                step=resume_step,
                source=source,
                duration_s=0.0,
                fallback_from=None,
            )

    def steps(
        self,
        first: int,
        last: int,
        t: float,
        dur: float,
        *,
        first_dur: float | None = None,
        ranks: list[int] | None = None,
    ) -> float:
        """Steps first..last on every live rank, back to back from time t; returns the time after the last."""
        for step in range(first, last + 1):
            d = first_dur if (first_dur is not None and step == first) else dur
            for rank in ranks if ranks is not None else sorted(self.logs):
                self.logs[rank].emit("step", ts=t + d, step=step, loss=1.0, duration_s=d, t_start=t)
            t += d
        return t

    def ckpt(
        self, step: int, phase: str, ts: float, duration_s: float, *, ranks: list[int] | None = None
    ) -> None:
        for rank in ranks if ranks is not None else sorted(self.logs):
            self.logs[rank].emit("ckpt", ts=ts, step=step, phase=phase, duration_s=duration_s)

    def fault(self, kind: str, step: int, rank: int, ts: float) -> None:
        self.logs[rank].emit("fault", ts=ts, fault=kind, step=step, target_rank=rank)

    def launcher_event(self, kind: str, ts: float, **fields: object) -> None:
        if self.launcher is None:
            self.launcher = self._log("launcher", None)
        self.launcher.emit(kind, ts=ts, **fields)

    def end(self, step: int, ts: float) -> None:
        for log in self.logs.values():
            log.emit("end", ts=ts, step=step)

    def close_workers(self) -> None:
        for log in self.logs.values():
            log.close()
        self.logs = {}

    def close(self) -> None:
        self.close_workers()
        if self.launcher is not None:
            self.launcher.close()


def fault_free_run(
    run_dir: Path,
    *,
    steps: int = 10,
    dur: float = 0.5,
    first_dur: float = 2.0,
    interval: int = 5,
    stall: float = 0.05,
    write: float = 1.0,
) -> dict[str, float]:
    """A finished 2-rank async run with no fault; returns the inputs the tests need."""
    run = SyntheticRun(run_dir)
    run.start_attempt(0, T0, resume_step=None)
    t = T0 + 3.0
    for first in range(1, steps + 1, interval):
        last = min(first + interval - 1, steps)
        t = run.steps(first, last, t, dur, first_dur=first_dur if first == 1 else None)
        run.ckpt(last, "stall", t + stall, stall)
        t += stall
        run.ckpt(last, "write", t + write, write)
        run.ckpt(last, "commit", t + write, 0.0, ranks=[0])
    run.ckpt(steps, "drain", t + 0.4, 0.4)
    t += 0.4
    run.end(steps, t)
    run.close()
    return {"t_end": t}
