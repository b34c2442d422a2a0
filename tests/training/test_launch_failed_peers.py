"""A failed worker's peers are SIGKILLed at once: torchelastic would SIGTERM them and wait 30 s, and a trainer
takes SIGTERM as a drain request (it keeps running), so every failure would cost 30 s. The agent is built as
the launcher builds it, with a one-node static rendezvous, and starts two real workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.utils import macros

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.launcher.agent import KitElasticAgent
from fsdpkit.launcher.monitor import HeartbeatMonitor, HeartbeatSettings
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.heartbeat import HEARTBEAT_DIR_ENV

WAIT_S = 30.0
WORKER = """
import os, sys, time
if sys.argv[1] == "0":  # local rank 0 ends with the code under test (negative: killed by that signal)
    code = int(sys.argv[2])
    if code < 0:
        os.kill(os.getpid(), -code)
    sys.exit(code)
time.sleep(60)
"""


@pytest.fixture
def agent_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], KitElasticAgent]]:
    """`agent_for(code)`: a started agent whose local rank 0 exits with `code` and rank 1 sleeps."""
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path / "beats"))  # the agent sets it for its workers
    made: list[KitElasticAgent] = []

    def make(code: int) -> KitElasticAgent:
        params = RendezvousParameters(
            backend="static", endpoint=f"127.0.0.1:{free_port_run()}", run_id="failed-peers",
            min_nodes=1, max_nodes=1, rank=0,
        )  # fmt: skip
        spec = WorkerSpec(
            role="trainer", local_world_size=2, rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
            entrypoint=sys.executable, args=("-c", WORKER, macros.local_rank, str(code)), max_restarts=0,
        )  # fmt: skip
        settings = HeartbeatSettings(timeout_s=60, load_timeout_s=60, safety_factor=3, min_timeout_s=60)
        agent = KitElasticAgent(
            spec,
            DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
            monitor=HeartbeatMonitor(tmp_path / "beats", settings),
            events=EventLog(tmp_path, role="launcher", rank=None),
            stacks_dir=str(tmp_path / "stacks"),
        )
        made.append(agent)
        agent._initialize_workers(agent.get_worker_group())  # torchelastic's rendezvous, then the start
        return agent

    yield make
    for agent in made:
        agent._shutdown(signal.SIGKILL)
        agent.exits.close()
        agent.get_worker_group().spec.rdzv_handler.shutdown()


def _worker(agent: KitElasticAgent, local_rank: int) -> subprocess.Popen:
    """The worker's process as torchelastic holds it (its owner: the one that reaps it)."""
    return internals.worker_processes(agent).subprocess_handlers[local_rank].proc


def _wait_exited(pid: int) -> None:
    """Wait until the process has exited, without reaping it (the agent finds it so)."""
    deadline = time.monotonic() + WAIT_S
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"worker {pid} still running after {WAIT_S:g} s"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("code", "peer_killed"), [(1, True), (-9, True), (exitcodes.DRAINED, False), (0, False)]
)
def test_peers_of_a_failed_worker_are_killed_and_clean_exits_are_not_failures(
    agent_for: Callable[[int], KitElasticAgent], code: int, peer_killed: bool
) -> None:
    agent = agent_for(code)
    failing, peer = _worker(agent, 0), _worker(agent, 1)
    _wait_exited(failing.pid)
    agent.exits.kill_peers_of_a_failed_worker(agent.exits.states())  # what `_monitor_workers` does first
    if peer_killed:
        assert peer.wait(timeout=WAIT_S) == -signal.SIGKILL
    else:
        assert peer.poll() is None
    assert failing.wait(timeout=WAIT_S) == code  # still reaped by torchelastic: WNOWAIT left it


def test_node_failure_limit_defaults_to_off_without_spares_and_3_with():
    from fsdpkit.launcher.cli import parse_args

    base = ["--standalone", "--nproc-per-node", "2", "-m", "fsdpkit.trainer"]
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
    assert parse_args([*spares, "-m", "fsdpkit.trainer"]).node_failure_limit == 3
    assert parse_args(["--node-failure-limit", "5", *base]).node_failure_limit == 5
