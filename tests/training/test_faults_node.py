"""The node-level faults act on exactly one pod: every process of it, never one outside
(training/runtime/pod.py).

A stand-in "pod": a process started in its own session with POD_NAME set, which starts a child in a new
session of its own (as torchelastic starts workers) and that child a grandchild; a neighbour with another
POD_NAME runs beside them under the same parent. The grandchild then acts like an injected fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdpkit.launcher.node_failures import NodeFailures
from fsdpkit.resilience.faults import Fault, NodeFaultTarget, parse_spec

REPO = Path(__file__).resolve().parents[2]

POD = r"""
import os, subprocess, sys, time
folder, depth, code, action = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
open(os.path.join(folder, f"pid-{os.getpid()}"), "w").close()
if depth < 2:
    argv = [sys.executable, "-c", code, folder, str(depth + 1), code, action]
    subprocess.Popen(argv, start_new_session=True)
else:
    deadline = time.monotonic() + 20
    while len(os.listdir(folder)) < 3:
        if time.monotonic() > deadline:
            sys.exit(f"pod {folder}: its three processes never all started")
        time.sleep(0.02)
    from fsdpkit.runtime import pod
    if action == "kill_pod":
        pod.kill_pod()
    elif action == "freeze_pod":
        pod.freeze_pod(1.5)
    else:
        pod.drain_pod(0.5)
time.sleep(60)
"""


def _start(tmp: Path, name: str, action: str) -> subprocess.Popen[bytes]:
    folder = tmp / name
    folder.mkdir()
    return subprocess.Popen(
        [sys.executable, "-c", POD, str(folder), "0", POD, action],
        env={**os.environ, "POD_NAME": name, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )


def _pids(tmp: Path, name: str) -> list[int]:
    return [int(p.name.split("-")[1]) for p in (tmp / name).glob("pid-*")]


def _state(pid: int) -> str:
    """The process' state letter (R, S, T: stopped, Z), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z")


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("action", ["kill_pod", "freeze_pod", "drain_pod"])
def test_node_fault_ends_every_process_of_its_pod_and_nothing_else(tmp_path: Path, action: str) -> None:
    pod = _start(tmp_path, "pod-a", action)
    neighbour = _start(tmp_path, "pod-b", "kill_pod")
    neighbour_pids: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while len(_pids(tmp_path, "pod-a")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = _pids(tmp_path, "pod-a")
        assert len(members) == 3
        if action == "freeze_pod":  # a silent host: every process stopped, none gone, until the kill
            deadline = time.monotonic() + 10
            while not all(_state(p) == "T" for p in members) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert [_state(p) for p in members] == ["T"] * 3
        pod.wait(timeout=20)
        # node: SIGKILL at once; freeze: SIGKILL after 1.5 s; drain: SIGTERM to the main process, SIGKILL to
        # the rest after 0.5 s
        assert pod.returncode == (-signal.SIGTERM if action == "drain_pod" else -signal.SIGKILL)
        assert _wait_gone(members, 10) == []
        # pod-b ran beside it, all three of its processes (on a loaded machine it may start after pod-a
        # ended), and only its own fault, which waits for the three, ends it
        deadline = time.monotonic() + 20
        while len(neighbour_pids := _pids(tmp_path, "pod-b")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(neighbour_pids) == 3
        neighbour.wait(timeout=20)
        assert neighbour.returncode == -signal.SIGKILL
    finally:
        for proc in (pod, neighbour):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in _pids(tmp_path, "pod-a") + _pids(tmp_path, "pod-b"):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_node_kinds_name_a_node_and_rank_kinds_a_rank() -> None:
    assert parse_spec("node:step=3:node=0,drain:time=2.5:node=1,kill:step=4:rank=1,freeze:step=5:node=1") == [
        Fault(kind="node", node=0, step=3),
        Fault(kind="drain", node=1, time_s=2.5),
        Fault(kind="kill", rank=1, step=4),
        Fault(kind="freeze", node=1, step=5),
    ]
    assert str(Fault(kind="node", node=0, step=3)) == "node:step=3:node=0"
    assert Fault(kind="drain", node=1, time_s=2.5).key == "drain-t2.5-node1"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("node:step=3:rank=0", "node takes node=, not rank=; write node=K"),
        ("kill:step=3:node=0", "kill takes rank=, not node=; write rank=R"),
        ("drain:step=3", "no node;"),
        ("node:step=3:node=-1", "node must be an integer >= 0, got '-1'"),
    ],
)
def test_node_fault_spec_errors_name_the_fix(spec: str, message: str) -> None:
    from fsdpkit.resilience.faults import FaultConfigError

    with pytest.raises(FaultConfigError, match=message):
        parse_spec(spec)


def test_only_local_rank_0_of_the_named_pod_acts() -> None:
    fault = Fault(kind="node", node=1, step=3)
    assert NodeFaultTarget(node=1, local_rank=0).acts_on(fault)
    assert not NodeFaultTarget(node=1, local_rank=1).acts_on(fault)
    assert not NodeFaultTarget(node=0, local_rank=0).acts_on(fault)


def test_node_failures_count_within_the_window_only() -> None:
    failures = NodeFailures(limit=2, window_s=10)
    assert failures.add(100.0) is None
    assert failures.add(111.0) is None  # the first one fell out of the window
    assert failures.add(115.0) == 2
    assert NodeFailures(limit=0, window_s=10).add(1.0) is None  # 0: never give up
