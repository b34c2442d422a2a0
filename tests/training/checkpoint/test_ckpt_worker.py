"""The background writer's thread: `idle` puts that thread (only) in SCHED_IDLE; without it, normal."""

from __future__ import annotations

import os
import threading

import pytest

from fsdpkit.resilience.checkpoint.worker import BackgroundWorker

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _policies(worker: BackgroundWorker) -> list[tuple[int, int]]:
    """(scheduling policy, native thread id) seen by two jobs run on the worker."""
    seen: list[tuple[int, int]] = []
    for _ in range(2):
        worker.submit(lambda: seen.append((os.sched_getscheduler(0), threading.get_native_id())))
    assert worker.drained(10.0)
    return seen


@linux_only
def test_idle_worker_runs_its_jobs_in_sched_idle_and_leaves_the_caller_alone() -> None:
    caller = os.sched_getscheduler(0)
    worker = BackgroundWorker("test-idle", idle=True)
    try:
        seen = _policies(worker)
    finally:
        assert worker.close(10.0)
    assert [policy for policy, _ in seen] == [os.SCHED_IDLE, os.SCHED_IDLE]
    assert seen[0][1] != threading.get_native_id()
    assert os.sched_getscheduler(0) == caller == os.SCHED_OTHER


@linux_only
def test_normal_worker_keeps_the_normal_class() -> None:
    worker = BackgroundWorker("test-normal")
    try:
        seen = _policies(worker)
    finally:
        assert worker.close(10.0)
    assert [policy for policy, _ in seen] == [os.SCHED_OTHER, os.SCHED_OTHER]
