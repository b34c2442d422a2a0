"""One background thread that runs save jobs in order; stopped by a sentinel, as torchtitan's purger."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from training.checkpoint.comm import SAVE_ERRORS

log = logging.getLogger("training.checkpoint")
_STOP = object()


class BackgroundWorker:
    """Runs submitted callables one at a time on a daemon thread (a SIGKILL never waits for it)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            try:
                job()  # type: ignore[operator]
            except SAVE_ERRORS:  # a job reports its own failures; this is a bug guard, not a policy
                log.exception("checkpoint background job crashed")
            del job  # its closure holds the save's state: never keep it while waiting for the next

    def drained(self, timeout_s: float) -> bool:
        """True once every job submitted so far has ended (and released its closure), within timeout_s."""
        marker = threading.Event()
        self._jobs.put(marker.set)
        return marker.wait(timeout_s)

    def close(self, timeout_s: float | None = None) -> bool:
        """Stop after the jobs already submitted; True once the thread has ended within `timeout_s`."""
        self._jobs.put(_STOP)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
