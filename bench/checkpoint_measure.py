"""What the checkpoint benchmarks read while one competitor trains and saves: its figures (`Measured`), the
peak host memory, the CPU of the threads its saves start, and the time the loop spends in save calls.

Linux only: thread CPU is read from the kernel's per-thread clocks, listed in `/proc/self/task`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Measured:
    """One competitor's run on one rank, as the worker reports it to the parent's summary."""

    name: str
    rep: int = 0
    """Repetition this run belongs to."""
    available: bool = True
    reason: str = ""
    wall_s: float = 0.0
    """Training loop, first step to last step, final drain excluded."""
    drain_s: float = 0.0
    stalls_s: list[float] = field(default_factory=list)
    """Per save: time the loop was blocked by it."""
    step_s: list[float] = field(default_factory=list)
    overlapped: list[bool] = field(default_factory=list)
    """Per step: a background write of this rank was in flight when the step began."""
    peak_rss_growth: int = 0
    staging_bytes: int = 0
    cpu_s: float = 0.0
    """CPU seconds of the whole process (all threads) over loop + drain (the cross-check figure)."""
    save_cpu_s: float = 0.0
    """CPU seconds of the saves themselves, measured directly: the main thread inside the save calls,
    the waits outside the steps and the drain, plus every thread born during the run, plus the checkpoint
    group's own gloo threads (see `ThreadCpu`)."""
    main_save_cpu_s: float = 0.0
    """The main thread's part of save_cpu_s."""
    loop_stall_s: float = 0.0
    """Wall seconds the loop spent in save calls and in waits outside the steps (drain excluded); unlike
    stalls_s it leaves out the kit's optimizer-hook wait, which a step's own time already holds."""
    born_threads: int = 0
    lost_threads: int = 0
    """Threads alive at the run's start that were gone by its end (their CPU after the start would count
    as the save's; each run first waits, bounded, for the previous run's threads to end)."""


class RssSampler:
    """Peak resident memory of this process above a baseline, sampled every 20 ms on a thread."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._stop = threading.Event()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.native_id = self._thread.native_id

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(0, self.peak - self.base)


def thread_cpu_ns() -> dict[int, int]:
    """On-CPU nanoseconds of every live thread of this process (threads listed in `/proc/self/task`),
    each read from the kernel's per-thread CPU clock, the clock `time.process_time()` sums. Unlike the
    first field of `/proc/self/task/<tid>/schedstat`, that clock includes a running thread's current slice
    (schedstat lags by up to a scheduler tick per running thread: ~10 ms per run here). A thread that ends
    while being read is left out."""
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        try:  # Linux's clock id of thread `tid` (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED))
            out[tid] = time.clock_gettime_ns((~tid << 3) | 6)
        except OSError:
            continue
    return out


class ThreadCpu:
    """CPU of the threads born between `__init__` and `stop()`, and of the listed `also` threads.

    Born threads (the kit's writer and its group's gloo threads, DCP's executor and stager threads) may end
    before `stop()`, so their CPU is what is left of the process's CPU delta once every thread that was
    alive at the start has its own delta taken out. A thread alive at the start and gone at the end cannot
    be read any more: it is counted in `lost`."""

    def __init__(self, also: set[int]) -> None:
        self._also = also
        self._exclude: set[int] = set()
        self._before = thread_cpu_ns()
        self._cpu0 = time.process_time()

    def exclude(self, tid: int | None) -> None:
        """A thread born after the start that is not the save's (the memory sampler): left out."""
        if tid is not None:
            self._exclude.add(tid)

    def stop(self) -> tuple[float, int, int]:
        """(CPU seconds of born + `also` threads, born threads alive now, pre-existing threads lost)."""
        cpu = time.process_time() - self._cpu0
        after = thread_cpu_ns()
        kept = [t for t in self._before if t in after]
        pre = sum(after[t] - self._before[t] for t in kept) / 1e9
        also = sum(after[t] - self._before[t] for t in kept if t in self._also) / 1e9
        left_out = sum(after.get(t, 0) for t in self._exclude if t not in self._before) / 1e9
        born = sum(1 for t in after if t not in self._before and t not in self._exclude)
        return max(0.0, cpu - pre - left_out) + also, born, len(self._before) - len(kept)


class Window:
    """Accumulates the wall and this thread's CPU time spent inside `with window:` blocks."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def __enter__(self) -> Window:
        self._t0, self._c0 = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s += time.perf_counter() - self._t0
        self.cpu_s += time.thread_time() - self._c0


def settle_threads(baseline: set[int], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until the threads a previous run started have ended, so that none of them ends
    during the next run's measurement (its CPU could not be told apart). One still there after the
    timeout stays for good: it joins `baseline`, so later runs do not wait for it again."""
    deadline = time.monotonic() + timeout_s
    while extra := set(thread_cpu_ns()) - baseline:
        if time.monotonic() >= deadline:
            baseline |= extra
            return
        time.sleep(0.01)
