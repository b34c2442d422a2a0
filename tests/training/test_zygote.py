"""The zygote's side of a group restart: the launcher can wait until the workers of stopped shims are gone.

torchelastic waits for the processes it started (the shims); a SIGKILLed shim's worker is SIGKILLed by the
zygote a moment later. Here the zygote is stopped (SIGSTOP) while the shim is killed, so the worker outlives
its shim for as long as the test says: the wait must report it, then see it gone once the zygote runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from training.launcher.zygote import SHIM_PATH, Zygote

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    folder = tempfile.mkdtemp(prefix="kit-zyg-", dir="/tmp")  # a short AF_UNIX path
    warm = Zygote(folder, prewarm=[])
    try:
        yield warm
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(warm.pid, signal.SIGCONT)
        warm.close()
        shutil.rmtree(folder, ignore_errors=True)


def _start_worker(zygote: Zygote, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(120)\n")
    env = {**os.environ, **zygote.env, "PYTHONPATH": str(REPO)}
    shim = subprocess.Popen([sys.executable, "-S", SHIM_PATH, str(script)], env=env)
    deadline = time.monotonic() + 30
    while not (workers := zygote.live_workers()):
        assert time.monotonic() < deadline, "the zygote started no worker"
        time.sleep(0.01)
    (worker,) = workers
    return shim, worker


def test_the_worker_of_a_killed_shim_is_waited_for(zygote: Zygote, tmp_path: Path) -> None:
    shim, worker = _start_worker(zygote, tmp_path)
    assert psutil.Process(worker).ppid() == zygote.pid
    os.kill(zygote.pid, signal.SIGSTOP)  # the zygote cannot kill the worker yet
    shim.kill()
    shim.wait(timeout=10)
    assert zygote.wait_workers_gone(0.3) == [worker]  # still running: reported after the bounded wait
    assert psutil.Process(worker).status() != psutil.STATUS_ZOMBIE
    os.kill(zygote.pid, signal.SIGCONT)  # it sees the shim gone and SIGKILLs the worker's group
    assert zygote.wait_workers_gone(10) == []
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    assert zygote.live_workers() == []
