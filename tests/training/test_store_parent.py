"""The rendezvous store's pod under the local runner (`--exit-with-parent`): a runner killed outright
(SIGKILL, a benchmark's timeout) must not leave its store serving on the host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from fsdpkit.contracts.ports import free_port_run

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    store = subprocess.Popen([sys.executable, "-m", "fsdpkit.launcher.store", "--host", "127.0.0.1",
                              "--port", sys.argv[1], *sys.argv[2:]])
    print(store.pid, flush=True)
    time.sleep(600)
    """
)


def _store_of_a_killed_parent(tmp_path: Path, *flags: str) -> psutil.Process:
    port = free_port_run(1, host="127.0.0.1")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(port), *flags], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert parent.stdout is not None
    store = psutil.Process(int(parent.stdout.readline()))
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    return store


def test_a_store_whose_runner_was_killed_stops_by_itself(tmp_path: Path) -> None:
    store = _store_of_a_killed_parent(tmp_path, "--exit-with-parent")
    deadline = time.monotonic() + 30
    while store.is_running() and store.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the store still serves 30 s after its runner was killed"
        time.sleep(0.1)
