"""`checkpoint.interval: auto`: the save interval chosen from what the run measures, Young/Daly's way.

Young (CACM 17(9), 1974) and Daly (FGCS 22(3), 2006): with δ the cost of one checkpoint (the time it adds
to the job) and M the mean time between failures, the compute time between checkpoints that minimises the
expected time lost (saving plus recomputing after a fault) is, for δ < 2M,

    τ = sqrt(2δM) · [1 + ⅓·sqrt(δ/2M) + δ/18M] - δ      (Daly's higher-order estimate; τ = M for δ >= 2M)

whose first term, sqrt(2δM), is Young's. docs/checkpointing.md ("Choosing the interval") has the details.

Inputs, all measured by rank 0 in the loop (`observe`, once per step, from `Checkpointer.maybe_save`):
  step_s  median duration of the recent steps that ran with no background write in flight ("clean");
  δ       the loop's stall in `maybe_save` for one save, plus the slow-down of the steps that overlapped
          its background write (each one's duration minus step_s, when positive); the median of the last
          5 saves, so one odd save does not swing the interval;
  writes  steps one background write took (the steps that started while it was in flight, one more if
          the next save had to wait for it), the most of the last 5 saves: the interval's floor;
  M       the prior `mtbf_s` blended with the faults this run has seen that rolled work back (`RunHistory`;
          an in-process restart from the live state computes nothing again, so it is none):
          M = (mtbf_s + exposure_s) / (1 + faults), i.e. the prior counts as one fault after mtbf_s.
It is re-evaluated once per save, when that save is fully measured (at the first step that starts after
its write is over, once at least two clean steps were seen, or at the next save if that comes first); until
the session's first save is measured, no second one is started (`proposal`). A new session (a restarted
process, or an in-process restart) starts from the last `interval` event's measured inputs with the faults
counted anew, else from interval_min.

Consistency: a checkpoint is a collective, so every rank must save at the same steps. Only rank 0 measures
and chooses; `proposal()` is its choice (0 elsewhere) and the step's loss all-reduce (SUM) carries it, so
every rank `agree()`s on rank 0's value at the same step, with no extra collective. `due()` then uses only
values every rank holds alike: the agreed interval and the step of the last save or restore.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.runtime.events import EventLog, events_dir

log = logging.getLogger("fsdpkit.resilience.checkpoint")

INTERVAL_EVENT = "interval"
"""Event kind rank 0 emits when the chosen interval changes (fields: `Choice`, plus reason, previous)."""
_CLEAN_WINDOW = 101
"""Clean step durations kept for the median (recent enough to follow a drift, enough to ignore outliers)."""
_BASELINE_STEPS = 2
"""Clean steps a save's slow-down is weighed against: a save whose write ended before that many were seen
(the session's first, early on) is settled once they are (or when the next save starts)."""
_SAVE_WINDOW = 5
"""Saves whose costs (median) and write lengths (max) the choice uses: one slow or fast save must not swing
the interval, yet a lasting change shows within a few saves."""


# ------------------------------------------------------------------------------------- the arithmetic
def young_s(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints: sqrt(2δM)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints (seconds; M when δ >= 2M)."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return young_s(cost_s, mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def blended_mtbf_s(prior_s: float, exposure_s: float, faults: int) -> float:
    """MTBF estimate: the prior counts as one fault after `prior_s` of exposure (the mean of a Gamma(1, prior)
    prior on the failure rate, updated by `faults` seen in `exposure_s`, inverted)."""
    return (prior_s + max(0.0, exposure_s)) / (1 + faults)


def interval_steps(tau_s: float, step_s: float, write_steps: int, *, lo: int, hi: int) -> int:
    """τ in whole steps (rounded half up), not below the steps one write takes, within [lo, hi].

    `hi` wins over the write floor: it is the user's bound on lost work, so the loop then waits for the
    previous write (as with a fixed interval: stall events and a warning)."""
    raw = math.floor(tau_s / step_s + 0.5) if step_s > 0 else hi
    return min(hi, max(lo, write_steps, raw, 1))


@dataclass(frozen=True)
class Choice:
    """One evaluation: the interval and every input it came from (the `interval` event's fields)."""

    interval: int
    cost_s: float
    step_s: float
    write_steps: int
    mtbf_s: float
    faults_seen: int
    exposure_s: float
    optimum_s: float


def choose(
    cfg: CheckpointConfig, *, cost_s: float, step_s: float, write_steps: int, faults: int, exposure_s: float
) -> Choice:
    mtbf = blended_mtbf_s(cfg.mtbf_s, exposure_s, faults)
    tau = daly_s(cost_s, mtbf)
    steps = interval_steps(tau, step_s, write_steps, lo=cfg.interval_min, hi=cfg.interval_max)
    return Choice(steps, cost_s, step_s, write_steps, mtbf, faults, exposure_s, tau)


# ----------------------------------------------------------------------------------------- the history
@dataclass
class RunHistory:
    """What rank 0's earlier event files say: faults seen, time exposed to faults, the last measured inputs.

    Read once per Checkpointer (a new process, or a new session after an in-process restart), from the
    files of the trainers that were rank 0 only (one per process: `trainer-rank0-*.jsonl`), scanning for the
    few kinds needed, so a long run's millions of step lines of every rank are not parsed."""

    faults: int = 0
    """Interruptions that rolled back: every session (a process start, or an in-process restart) after the
    first, the one starting now included, except one that follows a clean end (`end` event: a planned
    stop_at) and one that resumed from the live state (nothing computed again: no cost to weigh)."""
    past_exposure_s: float = 0.0
    """Seconds earlier rank-0 processes ran (first to last event of each file), this one excluded."""
    own_start: float | None = None
    """Unix time of this process's first rank-0 event (None if it has written none yet)."""
    last: dict[str, Any] | None = None
    """The newest `interval` event's fields (its measured inputs), if any."""

    @classmethod
    def read(cls, run_dir: str | os.PathLike[str], *, live: bool = False) -> RunHistory:
        """`live`: the session starting now resumes from the live state (an in-process restart that rolls
        nothing back), so it is no fault."""
        history = cls()
        picked: list[dict[str, Any]] = []
        me = (socket.gethostname(), os.getpid())
        for path in sorted(Path(events_dir(run_dir)).glob("trainer-rank0-*.jsonl")):
            first, last = _scan(path, picked)
            if first is None:
                continue
            if path.name == f"trainer-rank0-{me[0]}-{me[1]}.jsonl":  # as EventLog names this process's file
                history.own_start = first
            else:
                history.past_exposure_s += last - first
        picked.sort(key=lambda e: e["ts"])
        sessions = _Sessions()
        for e in picked:
            sessions.see(e)
        if me in sessions.resumed or me not in sessions.started:  # the session starting now
            sessions.begin()
            if live:
                sessions.forgive()
        history.faults = sessions.faults
        history.last = next(
            (e for e in reversed(picked) if e["kind"] == INTERVAL_EVENT and e.get("step_s")), None
        )
        return history

    def exposure_s(self, now: float) -> float:
        return self.past_exposure_s + (now - self.own_start if self.own_start is not None else 0.0)


@dataclass
class _Sessions:
    """Counts interruptions in rank 0's `start`, `resume` and `end` events: a session begins at each process
    start and at each in-process restart (a second `resume` in one process); one that begins while the
    previous did not end cleanly follows a fault (a crash before the first resume included)."""

    count: int = 0
    faults: int = 0
    clean: bool = True
    started: set[tuple[Any, Any]] = field(default_factory=set)
    resumed: set[tuple[Any, Any]] = field(default_factory=set)
    """Processes (host, pid) whose current session has resumed: their next `resume` is a restart."""

    counted: bool = False
    """Whether the current session counted as a fault (undone when it resumed live)."""

    def begin(self) -> None:
        self.counted = bool(self.count and not self.clean)
        self.faults += self.counted
        self.count += 1
        self.clean = False

    def see(self, e: dict[str, Any]) -> None:
        who = (e.get("host"), e.get("pid"))
        if e["kind"] == "start":
            self.begin()
            self.started.add(who)
            self.resumed.discard(who)
        elif e["kind"] == "resume":
            if who in self.resumed:
                self.begin()
            self.resumed.add(who)
            if e.get("source") in ("live", "replica"):
                self.forgive()
        elif e["kind"] == "end":
            self.clean = True

    def forgive(self) -> None:
        """The current session resumed from the live state: nothing was rolled back, so for the interval it
        was no fault (Young/Daly's M is the mean time between failures that force a rollback)."""
        self.faults -= self.counted
        self.counted = False


_KINDS = ("start", "resume", "end", INTERVAL_EVENT)
_WANTED = tuple(f'"{k}"' for k in _KINDS)
"""Quick test before parsing a line (step lines never hold these strings); the parsed kind decides."""


def _scan(path: Path, picked: list[dict[str, Any]]) -> tuple[float | None, float]:
    """(first ts, last ts) of one event file, None first if it has none; appends the wanted kinds' events."""
    first: float | None = None
    tail = ["", ""]  # the last two lines: the very last may be torn (its writer killed mid-write)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if first is None or any(w in line for w in _WANTED):
                event = _parse(line)
                if event is not None:
                    first = event["ts"] if first is None else first
                    if event["kind"] in _KINDS:
                        picked.append(event)
            tail = [tail[1], line]
    if first is None:
        return None, 0.0
    final = _parse(tail[1]) or _parse(tail[0])
    return first, final["ts"] if final is not None else first


def _parse(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
        event["ts"] = float(event["ts"])
    except (ValueError, KeyError, TypeError):
        return None
    return event if isinstance(event.get("kind"), str) else None


def _measured(event: dict[str, Any] | None) -> tuple[float, float, int] | None:
    """(cost_s, step_s, write_steps) of an earlier `interval` event, None if absent or not plausible."""
    try:
        cost_s, step_s = float(event["cost_s"]), float(event["step_s"])  # type: ignore[index]
        write_steps, interval = int(event["write_steps"]), int(event["interval"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    plausible = math.isfinite(cost_s) and math.isfinite(step_s) and cost_s >= 0 and step_s > 0
    if not plausible or write_steps < 0 or interval < 1:
        return None
    return cost_s, step_s, write_steps


# ------------------------------------------------------------------------------------- the measurement
@dataclass
class _Pending:
    """One save being measured: its stall, then the steps that overlapped its background write."""

    step: int
    stall_s: float
    overlapped: list[float]


class AutoInterval:
    """The interval of `checkpoint.interval: auto`, chosen by rank 0 and agreed by every rank (see module)."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        run_dir: str | os.PathLike[str],
        rank: int,
        events: EventLog,
        live: bool = False,
    ) -> None:
        """`live`: this session resumes from the live state of the last one (see `RunHistory.read`)."""
        self.cfg = cfg
        self.rank = rank
        self.events = events
        self.agreed: int | None = None
        """Rank 0's interval, as the latest step's all-reduce delivered it (the same on every rank)."""
        self.chosen = cfg.interval_min
        self._clean: deque[float] = deque(maxlen=_CLEAN_WINDOW)
        self._pending: _Pending | None = None
        self._costs: deque[float] = deque(maxlen=_SAVE_WINDOW)
        self._writes: deque[int] = deque(maxlen=_SAVE_WINDOW)
        self._mark: float | None = None
        self._writing_at_mark = False
        self._history = RunHistory()
        if rank != 0:
            return
        self._history = RunHistory.read(run_dir, live=live)
        seed = _measured(self._history.last)
        if seed is not None:  # resume from what the last session measured
            cost_s, step_s, write_steps = seed
            self._costs.append(cost_s)
            self._writes.append(write_steps)
            self.chosen = int(self._history.last["interval"])  # type: ignore[index]
            self._choose(step=None, step_s=step_s, reason="history")
        else:
            self._emit(None, None, None, reason="start")

    # -- agreement (every rank) ------------------------------------------------------------------------
    def proposal(self) -> float:
        """This rank's share of the interval all-reduce (SUM): rank 0's choice, 0 elsewhere. While the
        session's first save is not measured yet (nothing measured before it either), rank 0 proposes
        interval_max: no second save before the first one's cost is known (at interval_min in the
        meantime, a 1-step floor made a save of every step and measured no clean step to weigh them)."""
        if self.rank != 0:
            return 0.0
        measuring_first = self._pending is not None and not self._costs
        return float(self.cfg.interval_max if measuring_first else self.chosen)

    def agree(self, value: float) -> None:
        self.agreed = round(value)

    def current(self, world_size: int) -> int:
        if self.agreed is None:
            if world_size == 1:
                return self.chosen
            raise RuntimeError(
                "checkpoint.interval=auto needs the interval agreed by train_step's all-reduce "
                "(Checkpointer.agree_interval); none arrived before this step"
            )
        return self.agreed

    # -- measurement (rank 0) --------------------------------------------------------------------------
    def observe(
        self, step: int, *, entered: float, left: float, saved: bool, busy: bool, writing: bool
    ) -> None:
        """One `maybe_save` call: `entered`/`left` (perf_counter) bound it, `saved` says it started a
        save, `busy` whether the previous write was still in flight as it was entered (a save then waits for
        it), `writing` whether a write is in flight as it returns. The step before it ran from the previous
        call's `left` to this `entered`."""
        if self.rank != 0:
            return
        if self._mark is not None:
            duration = entered - self._mark
            if self._writing_at_mark and self._pending is not None:
                self._pending.overlapped.append(duration)
            else:
                self._clean.append(duration)
            written = self._pending is not None and not self._writing_at_mark
            if self._pending is not None and (saved or (written and len(self._clean) >= _BASELINE_STEPS)):
                self._settle(step, waited=saved and busy)
        if saved:
            self._pending = _Pending(step=step, stall_s=left - entered, overlapped=[])
        self._mark, self._writing_at_mark = left, writing

    def _settle(self, step: int, *, waited: bool) -> None:
        """The pending save is fully measured (its write is over): its cost, then a new choice."""
        pending, self._pending = self._pending, None
        durations = self._clean or pending.overlapped
        step_s = statistics.median(durations) if durations else 0.0
        slowdown = sum(max(0.0, d - step_s) for d in pending.overlapped)
        self._costs.append(pending.stall_s + slowdown)
        self._writes.append(len(pending.overlapped) + (1 if waited else 0))
        self._choose(step=step, step_s=step_s, reason="measured")

    def _choose(self, *, step: int | None, step_s: float, reason: str) -> None:
        choice = choose(
            self.cfg,
            cost_s=statistics.median(self._costs),
            step_s=step_s,
            write_steps=max(self._writes),
            faults=self._history.faults,
            exposure_s=self._history.exposure_s(time.time()),
        )
        previous = self.chosen
        self.chosen = choice.interval
        if reason == "history" or choice.interval != previous:
            self._emit(step, choice, previous, reason=reason)

    def _emit(self, step: int | None, choice: Choice | None, previous: int | None, *, reason: str) -> None:
        if choice is None:  # nothing measured yet: interval_min, and the MTBF it will be weighed against
            exposure_s = self._history.exposure_s(time.time())
            mtbf = blended_mtbf_s(self.cfg.mtbf_s, exposure_s, self._history.faults)
            fields = {"interval": self.chosen, "mtbf_s": mtbf, "faults_seen": self._history.faults}
            line = (
                f"first save after {self.chosen} steps (interval_min), the next once it is measured; "
                f"MTBF {mtbf:.0f} s"
            )
        else:
            fields = asdict(choice)
            line = (
                f"{choice.interval} steps (was {previous}; save cost {choice.cost_s:.3f} s, step "
                f"{choice.step_s:.3f} s, write {choice.write_steps} step(s), MTBF {choice.mtbf_s:.0f} s with "
                f"{choice.faults_seen} fault(s) seen, optimum {choice.optimum_s:.1f} s)"
            )
        self.events.emit(INTERVAL_EVENT, step=step, previous=previous, reason=reason, **fields)
        print(f"[trainer] checkpoint interval auto: {line}", flush=True)
