"""A failed worker's peers are SIGKILLed at once: torchelastic would SIGTERM them and wait 30 s, and a trainer
takes SIGTERM as a drain request (it keeps running), so every failure would cost 30 s (real children)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from training.contracts import exitcodes
from training.launcher.agent import KitElasticAgent

SLEEPER = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); time.sleep(60)",
]


class Procs:
    """The part of torchelastic's process context the agent reads: the workers' pids."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs

    def pids(self) -> dict[int, int]:
        return {i: p.pid for i, p in enumerate(self.procs)}


def agent_over(procs: list[subprocess.Popen]) -> KitElasticAgent:
    agent = KitElasticAgent.__new__(KitElasticAgent)  # only the process context is needed here
    agent._pcontext = Procs(procs)
    return agent


def _exited(proc: subprocess.Popen) -> None:
    """Wait until the child has exited, without reaping it (as the agent finds it)."""
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("code", "peer_killed"), [(1, True), (-9, True), (exitcodes.DRAINED, False), (0, False)]
)
def test_peers_of_a_failed_worker_are_killed_and_clean_exits_are_not_failures(code: int, peer_killed: bool):
    if code < 0:
        failing = subprocess.Popen([sys.executable, "-c", f"import os; os.kill(os.getpid(), {-code})"])
    else:
        failing = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    peer = subprocess.Popen(SLEEPER)  # ignores SIGTERM, like a trainer asked to drain
    try:
        _exited(failing)
        agent = agent_over([failing, peer])
        agent._kill_peers_of_a_failed_worker(agent._worker_states())
        if peer_killed:
            assert peer.wait(timeout=10) == -signal.SIGKILL
        else:
            assert peer.poll() is None
        assert failing.wait(timeout=5) == code  # still reaped by its owner: WNOWAIT left it
    finally:
        peer.kill()
        peer.wait()


def test_node_failure_limit_defaults_to_off_without_spares_and_3_with():
    from training.launcher.cli import parse_args

    base = ["--standalone", "--nproc-per-node", "2", "-m", "training.trainer"]
    assert parse_args(base).node_failure_limit == 0
    spares = [
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h:1",
        "--rdzv-id",
        "j",
        "--spares",
        "1",
    ]
    assert parse_args([*spares, "-m", "training.trainer"]).node_failure_limit == 3
    assert parse_args(["--node-failure-limit", "5", *base]).node_failure_limit == 5
