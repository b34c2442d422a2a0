"""The zygote's side of a group restart: the launcher can wait until the workers of stopped shims are gone.

torchelastic waits for the processes it started (the shims); a SIGKILLed shim's worker is SIGKILLed by the
zygote a moment later. Here the zygote is stopped (SIGSTOP) while the shim is killed, so the worker outlives
its shim for as long as the test says: the wait must report it, then see it gone once the zygote runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
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


def _send_request(zygote: Zygote, argv: list[str], cwd: Path) -> socket.socket:
    """What the shim sends (training/launcher/shim.py): the request, with /dev/null as its stdio."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    body = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(zygote.socket_path)
    with open(os.devnull, "r+b") as null:
        socket.send_fds(conn, [struct.pack("!I", len(body))], [null.fileno()] * 3)
    conn.sendall(body)
    return conn


def test_a_shim_gone_before_its_reply_takes_its_worker_and_the_zygote_serves_on(
    zygote: Zygote, tmp_path: Path
) -> None:
    """A shim that dies between its request and the zygote's reply (its group stopped as it starts): the
    reply fails (EPIPE). That used to crash the zygote, leaving the worker running, orphaned, and every
    later shim without a zygote (seen once under load). The zygote is stopped while a shim's request
    arrives and the shim hangs up, so the reply is sure to fail."""
    script = tmp_path / "pid_then_sleep.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)")
    os.kill(zygote.pid, signal.SIGSTOP)
    _send_request(zygote, [str(script), str(tmp_path / "doomed.pid")], tmp_path).close()
    os.kill(zygote.pid, signal.SIGCONT)
    # The zygote handles requests in order: once a later one has its reply, the first was handled.
    with _send_request(zygote, [str(script), str(tmp_path / "later.pid")], tmp_path) as later:
        later.settimeout(30)
        reply = later.makefile("rb").readline()
        assert reply, "the zygote closed the connection: it crashed on the first request"
        worker = json.loads(reply)["pid"]
        deadline = time.monotonic() + 10
        while (live := zygote.live_workers()) != [worker] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live == [worker]
        time.sleep(0.5)  # an orphan would have written its pid by now
        if (tmp_path / "doomed.pid").exists():
            orphan = int((tmp_path / "doomed.pid").read_text())
            assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert zygote.wait_workers_gone(10) == []  # the later shim hung up too: its worker is killed
