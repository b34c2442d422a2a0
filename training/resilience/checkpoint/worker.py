"""One background thread that runs save jobs in order; stopped by a sentinel, as torchtitan's purger."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS

log = logging.getLogger("fsdpkit.resilience.checkpoint")
_STOP = object()


def lower_this_thread() -> None:
    """Put the calling thread in Linux's SCHED_IDLE class (unprivileged; threads it starts inherit it):
    it then runs only on CPU time that normal threads leave. Elsewhere, or if refused, it stays normal."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # pid 0: the calling thread
    except OSError as e:  # e.g. a seccomp profile that refuses sched_setscheduler
        log.warning("checkpoint writer keeps the normal scheduling class: %s", e)


class BackgroundWorker:
    """Runs submitted callables one at a time on a daemon thread (a SIGKILL never waits for it); `idle`:
    the thread runs in the SCHED_IDLE class (see `lower_this_thread`)."""

    def __init__(self, name: str, *, idle: bool = False) -> None:
        self._idle = idle
        self._jobs: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        if self._idle:
            lower_this_thread()
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            try:
                job()  # type: ignore[operator]
            except SAVE_ERRORS:  # a job reports its own failures; this is a bug guard, not a policy
                log.exception("checkpoint background job crashed")
            del job  # its closure holds the save's state: never keep it while waiting for the next

    def drained(self, timeout_s: float, *, give_up: Callable[[], bool] | None = None) -> bool:
        """True once every job submitted so far has ended (and released its closure), within timeout_s;
        False at once when `give_up()` turns true (checked every 0.1 s)."""
        marker = threading.Event()
        self._jobs.put(marker.set)
        deadline = time.monotonic() + timeout_s
        while not marker.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or (give_up is not None and give_up()):
                return False
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Stop after the jobs already submitted; True once the thread has ended within `timeout_s`."""
        self._jobs.put(_STOP)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
