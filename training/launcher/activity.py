"""Which workers' training threads are busy: the launcher's evidence that a silent rank computes, not hangs.

On a loaded machine a healthy rank can be silent for longer than its learned step timeout (2 cores shared
with other jobs: ranks were seen stale 0.61-0.75 s against timeouts of 0.35-0.74 s, caught in Adam, in the
model, writing a beat, and both ranks waiting in a collective whose gloo threads did not get a CPU). A hung
rank is different: the kit's `hang` fault sleeps, a SIGSTOPped rank is stopped, and its peers wait in a gloo
collective; none of their training threads runs (measured on gloo: all_reduce, all_gather and barrier add
0 ns of run or run-queue time to a blocked main thread), and gloo's threads wait on their sockets. So at
each monitor tick the launcher samples, from /proc, every worker's training thread (the main thread: the
one that beats) and the threads that move its collectives' data (gloo's, by name: `gloo_tcp_loop`,
`pt_gloo_runloop`), and no other: a checkpoint writer or a loader thread may run while the training thread
hangs. Per thread:

- `schedstat`: nanoseconds on a CPU plus nanoseconds runnable, waiting for one. Their sum grows at wall
  speed for a thread that computes, however contended the machine (a descheduled thread still waits in
  the run queue), and not at all for one that sleeps or is stopped. Where the kernel has no schedstat,
  utime + stime from `stat` (clock ticks of 10 ms; only the time on a CPU).
- the training thread's state from `stat`: "R" (on a CPU or in the run queue; the run-queue wait is only
  added to schedstat when the thread gets the CPU) and "D" (uninterruptible, e.g. a beat write throttled by
  the page cache's writeback: waiting on the kernel's work, not on a peer) count as busy. Not a collective
  thread's: gloo's event loop is caught in "R" for a moment now and then while its rank waits on a hung
  peer (measured: 8 ms of 200 ms, in "R" at the sample), which extended real hangs by up to 1.2 s.

A rank is busy when one of its sampled threads is: that time grew by at least `BUSY_SHARE` of the wall time
over the last `window_s` (a couple of monitor ticks), or its training thread is in "R" or "D" now. The
launcher's hang watch decides what to do with it (`training/launcher/hang.py`, `HangWatch`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

COLLECTIVE_THREADS = ("gloo", "pt_gloo")
"""Name prefixes of the threads that carry a rank's collectives (gloo's event loop, ProcessGroupGloo's
workers). NCCL's are left out: its proxy threads poll all the time, hung or not."""
BUSY_STATES = ("R", "D")
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


NAME_TTL_S = 1.0
"""How long a thread's name is trusted (a new thread is renamed by its owner just after it starts)."""


def sampled_threads(pid: int, names: dict[tuple[int, int], tuple[str, float]] | None = None) -> list[int]:
    """The tids of a worker's training (main) thread and its collective threads; [] if it is gone.
    `names`: a cache of (pid, tid) -> (name, when read), so a tick reads only new threads' names (a
    worker has ~10-40 threads; reading every name at every tick cost ~0.8 ms per worker under load)."""
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []
    now = time.monotonic()
    out = []
    for tid in tids:
        if tid == pid:
            out.append(tid)
            continue
        cached = names.get((pid, tid)) if names is not None else None
        if cached is None or now - cached[1] > NAME_TTL_S:
            cached = (_thread_name(pid, tid), now)
            if names is not None:
                names[(pid, tid)] = cached
        if cached[0].startswith(COLLECTIVE_THREADS):
            out.append(tid)
    if names is not None:  # forget this worker's exited threads
        listed = set(tids)
        for key in [k for k in names if k[0] == pid and k[1] not in listed]:
            del names[key]
    return out


def _thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def read_thread(pid: int, tid: int) -> ThreadClock | None:
    """The scheduler clock of one thread of a process (the main thread's tid is the pid); None if gone."""
    task = f"/proc/{pid}/task/{tid}"
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
    """Samples the training and collective threads of this node's workers at each monitor tick; says which
    ranks were busy lately."""

    def __init__(self, *, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"CpuActivity window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._history: dict[tuple[int, int], deque[tuple[float, ThreadClock]]] = {}  # (pid, tid) -> readings
        self._ranks: dict[int, int] = {}  # rank -> pid
        self._names: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, tid) -> (name, when read)

    def forget(self) -> None:
        """A new worker group: the old processes' readings say nothing about the new ones."""
        self._history.clear()
        self._ranks.clear()
        self._names.clear()

    def sample(self, pids: Mapping[int, int], now: float) -> None:
        """Read every rank's sampled threads once (`pids`: rank -> the worker's own pid), at time `now`."""
        self._ranks = dict(pids)
        seen: set[tuple[int, int]] = set()
        for pid in self._ranks.values():
            for tid in sampled_threads(pid, self._names):
                clock = read_thread(pid, tid)
                if clock is None:
                    continue
                seen.add((pid, tid))
                history = self._history.setdefault((pid, tid), deque())
                history.append((now, clock))
                # keep the newest reading at least a window old: the base the window is measured from
                while len(history) > 2 and history[1][0] <= now - self.window_s:
                    history.popleft()
        for key in set(self._history) - seen:  # exited threads and processes
            del self._history[key]
        live = set(self._ranks.values())
        for key in [k for k in self._names if k[0] not in live]:
            del self._names[key]

    def busy_ranks(self) -> list[int]:
        """The ranks with a thread busy over the window before the last sample (see the module docstring)."""
        busy = {pid for (pid, tid), history in self._history.items() if self._busy(history, main=tid == pid)}
        return sorted(rank for rank, pid in self._ranks.items() if pid in busy)

    @staticmethod
    def _busy(history: deque[tuple[float, ThreadClock]], *, main: bool) -> bool:
        last_t, last = history[-1]
        if main and last.state in BUSY_STATES:
            return True
        base_t, base = history[0]  # a window old, or the oldest reading while there is none that old
        elapsed = last_t - base_t
        return elapsed > 0 and (last.busy_ns - base.busy_ns) >= BUSY_SHARE * elapsed * 1e9
