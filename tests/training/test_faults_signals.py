"""The real faults in real processes: SIGKILL, an OOM death under a self-imposed limit, SIGSTOP, a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[2]
VICTIM = textwrap.dedent(
    """
    import sys
    from fsdpkit.runtime.events import EventLog
    from fsdpkit.resilience.faults import FaultConfig, FaultInjector
    run_dir, spec = sys.argv[1], sys.argv[2]
    events = EventLog(run_dir, role="trainer", rank=1)
    injector = FaultInjector(
        FaultConfig(spec=spec), rank=1, world_size=2, max_steps=100, events=events, run_dir=run_dir
    )
    for step in range(1, 101):
        injector.maybe_inject(step)
        events.emit("step", step=step, loss=0.0, duration_s=0.0, t_start=0.0)
    print("survived")
    """
)


def _start(tmp_path: Path, spec: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(tmp_path), spec],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_fault_event(tmp_path: Path, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        faults = [e for e in read_events(tmp_path) if e["kind"] == "fault"]
        if faults:
            return faults[0]
        time.sleep(0.02)
    raise AssertionError("no fault event")


def _steps(tmp_path: Path) -> list[int]:
    return [e["step"] for e in read_events(tmp_path) if e["kind"] == "step"]


@pytest.mark.parametrize("kind", ["kill", "oom"])
def test_kill_and_oom_die_by_sigkill_at_their_step(tmp_path: Path, kind: str) -> None:
    proc = _start(tmp_path, f"{kind}:step=5:rank=1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    assert "survived" not in out
    assert _steps(tmp_path) == [1, 2, 3, 4]
    fault = next(e for e in read_events(tmp_path) if e["kind"] == "fault")
    assert (fault["fault"], fault["step"], fault["target_rank"]) == (kind, 5, 1)
    assert (tmp_path / "faults" / f"{kind}-step5-rank1").exists()


@pytest.mark.parametrize("kind", ["sigstop", "hang"])
def test_sigstop_and_hang_keep_the_process_alive_without_progress(tmp_path: Path, kind: str) -> None:
    proc = _start(tmp_path, f"{kind}:step=3:rank=1")
    try:
        _wait_for_fault_event(tmp_path)
        process = psutil.Process(proc.pid)
        if kind == "sigstop":
            deadline = time.monotonic() + 30
            while process.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
                time.sleep(0.02)
            assert process.status() == psutil.STATUS_STOPPED
        else:  # a working hang never exits; a no-op one would finish its 100 steps in milliseconds
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        assert proc.poll() is None
        assert _steps(tmp_path) == [1, 2]
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_time_kill_fires_from_the_timer_thread(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, threading\n"
            "from fsdpkit.runtime.events import EventLog\n"
            "from fsdpkit.resilience.faults import FaultConfig, FaultInjector\n"
            "ev = EventLog(sys.argv[1], role='trainer', rank=0)\n"
            "cfg = FaultConfig(spec='kill:time=0.2:rank=0')\n"
            "FaultInjector(cfg, rank=0, world_size=1, max_steps=1, events=ev)\n"
            "threading.Event().wait()\n",  # the training thread never reaches a step boundary
            str(tmp_path),
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.wait(timeout=60) == -signal.SIGKILL
    fault = next(e for e in read_events(tmp_path) if e["kind"] == "fault")
    assert fault["fault"] == "kill" and fault["step"] is None
