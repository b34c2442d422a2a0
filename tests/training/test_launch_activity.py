"""The launcher's busy check on real processes: a child that computes, one that sleeps, one that is stopped.

Sample times are passed explicitly and the test waits on the children's own /proc clocks (never a timed
sleep), so the verdicts do not depend on how loaded the machine is."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from training.launcher.activity import CpuActivity, read_main_thread
from training.launcher.monitor import HeartbeatMonitor, HeartbeatSettings

WAIT_S = 60
"""Only a bound on waiting for a child's clock (a broken test fails instead of hanging)."""


@contextlib.contextmanager
def child(code: str) -> Iterator[subprocess.Popen[str]]:
    """A python child that says "ready" on stdout, then runs `code`."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"print('ready', flush=True)\n{code}"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def busy_ns(pid: int) -> int:
    clock = read_main_thread(pid)
    assert clock is not None
    return clock.busy_ns


def test_a_computing_thread_is_busy_a_sleeping_or_stopped_one_is_not() -> None:
    activity = CpuActivity(window_s=0.5)
    with child("while True: pass") as spin, child("import time; time.sleep(600)") as sleep:
        ranks = {0: spin.pid, 1: sleep.pid}
        activity.sample(ranks, now=0.0)
        assert activity.busy_ranks() == []  # one reading: nothing known yet
        start = busy_ns(spin.pid)
        # 0.2 s of run (or run-queue) time, however long that takes: at "1 s" that is a 20 % share
        wait_until(lambda: busy_ns(spin.pid) - start >= 200_000_000, "the spinning child to run 0.2 s")
        activity.sample(ranks, now=1.0)
        assert activity.busy_ranks() == [0]
        assert read_main_thread(sleep.pid).state == "S"  # type: ignore[union-attr]

        spin.send_signal(signal.SIGSTOP)
        wait_until(lambda: read_main_thread(spin.pid).state in ("T", "t"), "the child to stop")  # type: ignore[union-attr]
        activity.sample(ranks, now=2.0)
        activity.sample(ranks, now=3.0)
        assert activity.busy_ranks() == []  # the window (0.5 s) looks back to the reading at 2.0 only


def test_exited_and_forgotten_processes_are_never_busy() -> None:
    activity = CpuActivity(window_s=0.5)
    with child("while True: pass") as spin:
        activity.sample({0: spin.pid}, now=0.0)
        start = busy_ns(spin.pid)
        wait_until(lambda: busy_ns(spin.pid) - start >= 200_000_000, "the spinning child to run 0.2 s")
        activity.sample({0: spin.pid}, now=1.0)
        assert activity.busy_ranks() == [0]
        activity.forget()  # a new worker group
        assert activity.busy_ranks() == []
    assert read_main_thread(spin.pid) is None  # killed and reaped
    activity.sample({0: spin.pid}, now=2.0)
    assert activity.busy_ranks() == []
    with pytest.raises(ValueError, match="window_s must be > 0"):
        CpuActivity(window_s=0.0)


def test_the_busy_cap_is_a_multiple_of_the_timeout_never_above_the_load_allowance(tmp_path: Path) -> None:
    settings = HeartbeatSettings(
        timeout_s=None, load_timeout_s=2.0, safety_factor=1.5, min_timeout_s=0.3, busy_cap_factor=3.0
    )
    monitor = HeartbeatMonitor(tmp_path, settings)
    assert monitor.busy_cap_s(0.4) == pytest.approx(1.2)
    assert monitor.busy_cap_s(1.0) == 2.0  # the load allowance caps it
    assert monitor.busy_cap_s(2.0) == 2.0  # "start", "load", "checkpoint": no extension
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="busy_cap_factor must be a finite number >= 1"):
            HeartbeatSettings(
                timeout_s=None, load_timeout_s=2.0, safety_factor=1.5, min_timeout_s=0.3, busy_cap_factor=bad
            )
