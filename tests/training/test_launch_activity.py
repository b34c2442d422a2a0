"""The launcher's busy check on real processes: children that compute, sleep, stop, or compute only in a
thread that is not the training thread nor a collective one.

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

from fsdpkit.launcher.activity import CpuActivity, read_thread, sampled_threads
from fsdpkit.launcher.monitor import HeartbeatMonitor, HeartbeatSettings

WAIT_S = 60
"""Only a bound on waiting for a child's clock (a broken test fails instead of hanging)."""
SPIN_IN_THREAD = """
import ctypes, threading, time
named = threading.Event()
def spin(name):
    ctypes.CDLL(None).prctl(15, name.encode())  # PR_SET_NAME, as gloo names its threads
    named.set()
    while True:
        pass
threading.Thread(target=spin, args=({name!r},), daemon=True).start()
named.wait()
print("named", flush=True)
time.sleep(600)
"""


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


def state(pid: int, tid: int | None = None) -> str:
    clock = read_thread(pid, pid if tid is None else tid)
    return "" if clock is None else clock.state


def ran_for(pid: int, tid: int, seconds: float) -> None:
    """Wait until the thread has run (or waited for a CPU) `seconds` more than now."""
    clock = read_thread(pid, tid)
    assert clock is not None
    start = clock.busy_ns
    wait_until(
        lambda: (read_thread(pid, tid) or clock).busy_ns - start >= seconds * 1e9, f"{tid} to run {seconds} s"
    )


def test_a_computing_thread_is_busy_a_sleeping_or_stopped_one_is_not() -> None:
    activity = CpuActivity(window_s=0.5)
    with child("while True: pass") as spin, child("import time; time.sleep(600)") as sleep:
        ranks = {0: spin.pid, 1: sleep.pid}
        wait_until(lambda: state(sleep.pid) == "S", "the sleeping child to sleep")
        activity.sample(ranks, now=0.0)
        # 0.2 s of run (or run-queue) time, however long that takes: at "1 s" that is a 20 % share
        ran_for(spin.pid, spin.pid, 0.2)
        activity.sample(ranks, now=1.0)
        assert activity.busy_ranks() == [0]

        spin.send_signal(signal.SIGSTOP)
        wait_until(lambda: state(spin.pid) in ("T", "t"), "the child to stop")
        activity.sample(ranks, now=2.0)
        activity.sample(ranks, now=3.0)
        assert activity.busy_ranks() == []  # the window (0.5 s) looks back to the reading at 2.0 only


def test_only_the_training_thread_and_collective_threads_count() -> None:
    activity = CpuActivity(window_s=0.5)
    code = SPIN_IN_THREAD.format
    with child(code(name="gloo_tcp_loop")) as gloo, child(code(name="ckpt_writer")) as writer:
        ranks = {0: gloo.pid, 1: writer.pid}
        assert [proc.stdout.readline() for proc in (gloo, writer)] == ["named\n"] * 2  # type: ignore[union-attr]
        tids = {rank: sampled_threads(pid) for rank, pid in ranks.items()}
        assert len(tids[0]) == 2 and tids[1] == [writer.pid]  # the writer thread is never sampled
        activity.sample(ranks, now=0.0)
        ran_for(gloo.pid, next(t for t in tids[0] if t != gloo.pid), 0.2)
        activity.sample(ranks, now=1.0)
        # a hung training thread beside a busy checkpoint writer is still hung; one whose gloo thread
        # moves data is not
        assert activity.busy_ranks() == [0]


def test_exited_and_forgotten_processes_are_never_busy() -> None:
    activity = CpuActivity(window_s=0.5)
    with child("while True: pass") as spin:
        activity.sample({0: spin.pid}, now=0.0)
        ran_for(spin.pid, spin.pid, 0.2)
        activity.sample({0: spin.pid}, now=1.0)
        assert activity.busy_ranks() == [0]
        activity.forget()  # a new worker group
        assert activity.busy_ranks() == []
    assert read_thread(spin.pid, spin.pid) is None and sampled_threads(spin.pid) == []  # reaped
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
