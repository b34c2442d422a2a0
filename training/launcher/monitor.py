"""Launcher-side heartbeat monitor: reads the ranks' beat files and says which rank is stale.

A rank's allowance depends on its announced phase (training/runtime/heartbeat.py):
- "start" (no file yet: spawn, import, process group, model build), "load" and "checkpoint", and the
  first step after entering "train": the load allowance (`--heartbeat-load-timeout`);
- "train" once the rank has beaten there: the step timeout, explicit (`--heartbeat-timeout SECONDS`)
  or learned (`auto`);
- "done": never stale.

Learning (`auto`): the step times the workers measure and carry in their beat files (beat to beat, or
beat to a "checkpoint" announcement; never the load or the save) are the samples, in two sets. The first step
after a save overlaps its background write and runs slow (~1.7-4 x the median on the 2-core test machine); the
monitor knows it by the beat that ended the "checkpoint" phase (`ts == since`) and learns it apart. An
ordinary step's timeout is max(floor, safety factor x the slowest of the last 200 ordinary samples), like
NVRx's timeout calculator (5 x the maximum) with a smaller default factor (1.5); the step after a save gets
the same over its own samples (never less, and the load allowance until one was seen). So the slow overlapped
steps never widen the timeout of the others, and a hang in an ordinary step is found within about 1.5 x the
slowest ordinary step. Until some rank has measured 20 steps the timeouts are provisional: twice that, from
the third measured step on, and the load allowance before. What was learned survives restarts of the group.

Past its allowance a rank is not declared hung at once while a training (or gloo) thread of this node is still
busy on a CPU (`HangWatch` asks `activity.CpuActivity`): a step slowed by a loaded machine computes, a hung
rank and its peers waiting in a collective do not. That extension is capped (`busy_cap_s`): busy_cap_factor x
the timeout, never above the load allowance, so a rank that burns CPU without progress (a livelock; a GPU rank
spinning in a CUDA sync) is still found, later. With the extension the floor can stay low (0.3 s): a loaded
machine makes slow steps, not silent ones.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from fsdpkit.runtime.heartbeat import read_record


@dataclass(frozen=True, kw_only=True)
class HeartbeatSettings:
    """Heartbeat timeouts, from the launcher's flags (checked there)."""

    timeout_s: float | None
    """Step timeout in "train"; None means learned from observed step intervals."""
    load_timeout_s: float
    """Allowance while a rank starts, loads a checkpoint or saves one, seconds."""
    safety_factor: float
    """Learned timeout = this x the slowest recent step time."""
    min_timeout_s: float
    """Floor of the learned timeout, seconds."""
    interrupt_grace_s: float = 0.0
    """A hung rank that says it is interruptible (fsdpkit.runtime.hang_interrupt) is interrupted first,
    and the group restarted only if it has not beaten again this many seconds later; 0 restarts at once."""
    busy_cap_factor: float = 3.0
    """A rank past its timeout while a training thread of this node is busy on a CPU gets up to this x its
    timeout (never above `load_timeout_s`) before it is declared hung; 1 turns the busy check off."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.busy_cap_factor) and self.busy_cap_factor >= 1):
            raise ValueError(f"busy_cap_factor must be a finite number >= 1, got {self.busy_cap_factor!r}")


class TimeoutLearner:
    """Turns observed step times into step timeouts (see the module docstring)."""

    MIN_STEPS = 20
    PROVISIONAL_STEPS = 3
    PROVISIONAL_MULTIPLIER = 2.0
    WINDOW = 200

    def __init__(self, *, safety_factor: float, min_timeout_s: float) -> None:
        self.safety_factor = safety_factor
        self.min_timeout_s = min_timeout_s
        self._samples: deque[float] = deque(maxlen=self.WINDOW)
        self._after_checkpoint: deque[float] = deque(maxlen=self.WINDOW)
        self._steps_by_rank: dict[int, int] = {}

    def observe(self, interval_s: float, *, rank: int, after_checkpoint: bool = False) -> None:
        """One step time; `after_checkpoint`: the first step after a save, which overlaps its background
        write (learned apart, so its slowness does not widen every other step's timeout)."""
        if interval_s > 0 and math.isfinite(interval_s):
            (self._after_checkpoint if after_checkpoint else self._samples).append(interval_s)
            self._steps_by_rank[rank] = self._steps_by_rank.get(rank, 0) + 1

    @property
    def samples(self) -> int:
        return len(self._samples) + len(self._after_checkpoint)

    def _factor(self) -> float | None:
        steps = max(self._steps_by_rank.values(), default=0)
        if steps < self.PROVISIONAL_STEPS:
            return None
        return self.safety_factor * (1.0 if steps >= self.MIN_STEPS else self.PROVISIONAL_MULTIPLIER)

    @property
    def timeout_s(self) -> float | None:
        """Timeout of an ordinary step (provisional before MIN_STEPS), or None while too few were seen."""
        factor = self._factor()
        if factor is None:
            return None
        ordinary = self._samples or self._after_checkpoint
        return max(self.min_timeout_s, factor * max(ordinary))

    @property
    def after_checkpoint_timeout_s(self) -> float | None:
        """Timeout of the first step after a save (never below the ordinary one); None until such a step
        was seen: how much a background write slows a step is not known before, so the load allowance."""
        ordinary = self.timeout_s
        factor = self._factor()
        if ordinary is None or factor is None or not self._after_checkpoint:
            return None
        return max(ordinary, factor * max(self._after_checkpoint))


@dataclass(frozen=True, kw_only=True)
class Stale:
    """A rank whose last sign of life is older than its phase allows."""

    rank: int
    phase: str
    step: int | None
    stale_s: float
    timeout_s: float


@dataclass(kw_only=True)
class _Seen:
    phase: str
    since: float
    step: int | None
    ts: float
    pid: int
    rhythm: bool
    n: int
    recent: list[float]
    interruptible: bool = False


class HeartbeatMonitor:
    """Watches the beat files of this node's ranks for one attempt at a time."""

    def __init__(self, root: str | os.PathLike[str], settings: HeartbeatSettings) -> None:
        self.root = Path(root)
        self.directory = self.root
        """The folder the current attempt's workers beat into (`reset` makes one per attempt)."""
        self._attempts = 0
        self.settings = settings
        self.learner = TimeoutLearner(
            safety_factor=settings.safety_factor, min_timeout_s=settings.min_timeout_s
        )
        self._ranks: list[int] = []
        self._started_at = 0.0
        self._seen: dict[int, _Seen] = {}
        self._after_checkpoint: dict[int, tuple[int, int]] = {}  # rank -> (pid, number of its next sample)
        self.last_step_ts: float | None = None
        """Unix time of the newest beat that reported a new step, over every attempt (the live metrics' "no
        progress" gauge); None before the first."""

    def reset(self, ranks: list[int]) -> Path:
        """A new attempt: a fresh folder for its beats (returned: the workers' KIT_HEARTBEAT_DIR), the
        clocks started now.

        Each attempt beats into its own folder because a worker of the old one can outlive the restart:
        under the zygote the agent stops the shims and the zygote SIGKILLs their workers a moment later,
        and a trainer restarting in process keeps beating until then. Its late beat in a shared folder
        stood for the new rank (a silent "train" beat of a dead pid: a false hang, a second restart), and
        the two processes shared the temp file the beat is renamed from. The folder of the attempt
        before the last is removed (its workers died an attempt ago)."""
        self._attempts += 1
        shutil.rmtree(self.root / f"attempt_{self._attempts - 2}", ignore_errors=True)
        self.directory = self.root / f"attempt_{self._attempts}"
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.glob("rank_*.json*"):  # a folder left by an earlier launcher
            path.unlink(missing_ok=True)
        self._ranks = list(ranks)
        self._started_at = time.time()
        self._seen = {}
        return self.directory

    def step_timeout_s(self, *, after_checkpoint: bool = False) -> float:
        """The timeout in "train" right now (explicit, learned, or the load allowance while learning)."""
        if self.settings.timeout_s is not None:
            return self.settings.timeout_s
        learner = self.learner
        learned = learner.after_checkpoint_timeout_s if after_checkpoint else learner.timeout_s
        return learned if learned is not None else self.settings.load_timeout_s

    def check(self, now: float | None = None) -> Stale | None:
        """Read every rank's beat; learn from it; return the stalest rank past its allowance, if any."""
        silent = self.silent(time.time() if now is None else now)
        return silent[0] if silent and silent[0].stale_s > silent[0].timeout_s else None

    def silent(self, now: float) -> list[Stale]:
        """Every rank not done, with its silence and allowance, the most overdue first."""
        out = []
        for rank in self._ranks:
            seen = self._read(rank)
            if seen is None:
                phase, step, last, rhythm = "start", None, self._started_at, False
            else:
                self._learn(rank, seen)
                phase, step, last, rhythm = seen.phase, seen.step, seen.ts, seen.rhythm
            if phase == "done":
                continue
            steady = phase == "train" and rhythm
            # The beat that ended a save is the rank's last word: it is in the step that overlaps the write.
            after = seen is not None and seen.ts == seen.since
            timeout = self.step_timeout_s(after_checkpoint=after) if steady else self.settings.load_timeout_s
            out.append(Stale(rank=rank, phase=phase, step=step, stale_s=now - last, timeout_s=timeout))
        return sorted(out, key=lambda s: s.timeout_s - s.stale_s)

    def busy_cap_s(self, timeout_s: float) -> float:
        """How long a rank with this timeout may stay silent while a training thread is busy on a CPU."""
        return max(timeout_s, min(self.settings.busy_cap_factor * timeout_s, self.settings.load_timeout_s))

    def pids(self) -> dict[int, int]:
        """Rank -> the worker's own pid, for every rank that beat in this attempt."""
        return {rank: seen.pid for rank, seen in self._seen.items()}

    def pid(self, rank: int) -> int | None:
        """The worker's own pid, from its beats (under the zygote the agent only knows the shim's)."""
        seen = self._seen.get(rank)
        return seen.pid if seen is not None else None

    def phases(self) -> dict[int, str]:
        """Rank -> its phase now, read afresh ("start" before its first beat)."""
        out = {}
        for rank in self._ranks:
            seen = self._read(rank)
            out[rank] = seen.phase if seen is not None else "start"
        return out

    def interruptible(self, rank: int) -> bool:
        """Its last beat said a hang interrupt is taken in place (fsdpkit.runtime.hang_interrupt)."""
        seen = self._seen.get(rank)
        return seen is not None and seen.interruptible

    def last_beat(self, rank: int) -> float | None:
        seen = self._seen.get(rank)
        return seen.ts if seen is not None else None

    def _read(self, rank: int) -> _Seen | None:
        record = read_record(self.directory, rank)
        if record is None:
            return self._seen.get(rank)  # missing, or caught mid-write: keep what we knew
        try:
            seen = _Seen(
                phase=record["phase"],
                since=record["since"],
                step=record["step"],
                ts=record["ts"],
                pid=record["pid"],
                rhythm=record["rhythm"],
                n=record["n"],
                recent=record["recent"],
                interruptible=record.get("interruptible") is True,
            )
        except (KeyError, TypeError):
            return self._seen.get(rank)  # not a record of this protocol: keep what we knew
        if seen.ts < self._started_at:
            return self._seen.get(rank)  # a leftover from an earlier attempt
        return seen

    def _learn(self, rank: int, seen: _Seen) -> None:
        before = self._seen.get(rank)
        self._seen[rank] = seen
        if seen.step is not None and (before is None or before.step != seen.step):
            self.last_step_ts = max(self.last_step_ts or 0.0, seen.ts)
        known = before.n if before is not None and before.pid == seen.pid else 0
        new = min(seen.n - known, len(seen.recent))
        marked = self._after_checkpoint.get(rank)
        for index, interval in enumerate(seen.recent[len(seen.recent) - new :] if new > 0 else []):
            number = (seen.pid, seen.n - new + 1 + index)
            self.learner.observe(interval, rank=rank, after_checkpoint=number == marked)
        if seen.phase == "train" and seen.rhythm and seen.ts == seen.since:
            self._after_checkpoint[rank] = (seen.pid, seen.n + 1)  # the next sample overlaps the write
