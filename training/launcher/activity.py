"""Which workers' training threads are busy: the launcher's evidence that a silent rank computes, not hangs.

On a loaded machine a healthy rank can be silent for longer than its learned step timeout (2 cores shared
with other jobs: ranks were seen stale 0.61-0.75 s against timeouts of 0.35-0.74 s, caught in Adam, in the
model, writing a beat). A hung rank is different: the kit's `hang` fault sleeps, a SIGSTOPped rank is
stopped, and its peers wait in a gloo collective; none of their main threads runs (measured on gloo:
all_reduce, all_gather and barrier add 0 ns of run or run-queue time to a blocked main thread). So at each
monitor tick the launcher samples every worker's main thread from /proc:

- `schedstat`: nanoseconds on a CPU plus nanoseconds runnable, waiting for one. Their sum grows at wall
  speed for a thread that computes, however contended the machine (a descheduled thread still waits in
  the run queue), and not at all for one that sleeps or is stopped. Where the kernel has no schedstat,
  utime + stime from `stat` (clock ticks of 10 ms; only the time on a CPU).
- the thread state from `stat`: "D" (uninterruptible, e.g. a beat write throttled by the page cache's
  writeback) counts as busy, since such a thread is waiting on the kernel's work, not on a peer.

A thread is busy when that time grew by at least `BUSY_SHARE` of the window's wall time over the last
`window_s` (a couple of monitor ticks), or it is in "D" now. The agent decides what to do with it
(`KitElasticAgent._monitor_workers`).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

BUSY_SHARE = 0.1
"""Run + run-queue time over wall time above which a thread is busy (computing ~1.0, asleep 0.0; the
fallback without schedstat sees only CPU time, which a contended rank gets a fraction of)."""
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, kw_only=True)
class ThreadClock:
    """One reading of a thread's scheduler clock."""

    busy_ns: int
    """Nanoseconds on a CPU plus waiting for one (schedstat), or on a CPU (stat) without schedstat."""
    state: str
    """The state letter from stat: R running, S sleeping, D uninterruptible, T stopped, ..."""


def read_main_thread(pid: int) -> ThreadClock | None:
    """The scheduler clock of a process's main thread (its tid is its pid); None if it is gone."""
    task = f"/proc/{pid}/task/{pid}"
    try:
        with open(f"{task}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rpartition(")")[2].split()
        state, cpu_ns = fields[0], (int(fields[11]) + int(fields[12])) * _TICK_NS
    except (OSError, IndexError, ValueError):
        return None
    try:
        with open(f"{task}/schedstat", encoding="ascii") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        busy_ns = int(run_ns) + int(wait_ns)
    except (OSError, ValueError):
        busy_ns = cpu_ns
    return ThreadClock(busy_ns=busy_ns, state=state)


class CpuActivity:
    """Samples the main threads of this node's workers at each monitor tick; says which were busy lately."""

    def __init__(self, *, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"CpuActivity window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._history: dict[int, deque[tuple[float, ThreadClock]]] = {}  # pid -> readings, oldest first
        self._ranks: dict[int, int] = {}  # rank -> pid

    def forget(self) -> None:
        """A new worker group: the old processes' readings say nothing about the new ones."""
        self._history.clear()
        self._ranks.clear()

    def sample(self, pids: Mapping[int, int], now: float) -> None:
        """Read every rank's main thread (`pids`: rank -> the worker's own pid) once, at time `now`."""
        self._ranks = dict(pids)
        live = set(self._ranks.values())
        for pid in list(self._history):
            if pid not in live:
                del self._history[pid]
        for pid in live:
            clock = read_main_thread(pid)
            if clock is None:
                self._history.pop(pid, None)
                continue
            history = self._history.setdefault(pid, deque())
            history.append((now, clock))
            # keep the newest reading at least a window old: the base the window is measured from
            while len(history) > 2 and history[1][0] <= now - self.window_s:
                history.popleft()

    def busy_ranks(self) -> list[int]:
        """The ranks whose main thread was busy over the window before the last sample (module docstring)."""
        return sorted(rank for rank, pid in self._ranks.items() if self._busy(pid))

    def _busy(self, pid: int) -> bool:
        history = self._history.get(pid)
        if not history:
            return False
        last_t, last = history[-1]
        if last.state == "D":
            return True
        base_t, base = history[0]  # a window old, or the oldest reading while there is none that old
        elapsed = last_t - base_t
        return elapsed > 0 and (last.busy_ns - base.busy_ns) >= BUSY_SHARE * elapsed * 1e9
