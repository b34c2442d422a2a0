"""An event line is in the OS when `emit` returns: a writer SIGKILLed right after it loses nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from fsdpkit.runtime.events import EventLog, read_events

CHILD = """
import os, signal, sys
from fsdpkit.runtime.events import EventLog
log = EventLog(sys.argv[1], role="trainer", rank=3)
for step in range(1, 4):
    log.emit("step", step=step, loss=1.0 / step, duration_s=0.01, t_start=0.0)
os.kill(os.getpid(), signal.SIGKILL)  # no close, no interpreter exit: only what reached the OS is left
"""


def test_lines_survive_sigkill_of_the_writer(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    events = read_events(tmp_path)
    assert [(e["kind"], e["step"], e["rank"]) for e in events] == [("step", n, 3) for n in (1, 2, 3)]
    (path,) = (tmp_path / "events").glob("*.jsonl")
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b"\n") == 3  # one line per event


def test_a_second_log_of_the_same_process_appends(tmp_path: Path) -> None:
    """The launcher and a library caller may open the same file (same role, rank, host, pid): O_APPEND
    keeps both writers' lines whole."""
    first, second = (EventLog(tmp_path, role="launcher", rank=None) for _ in range(2))
    first.emit("exit", code=0, reason="a")
    second.emit("exit", code=1, reason="b")
    first.emit("exit", code=2, reason="c")
    first.close()
    second.close()
    assert [e["code"] for e in read_events(tmp_path)] == [0, 1, 2]
