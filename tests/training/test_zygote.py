"""The zygote's side of a group restart: the launcher can wait until the workers of stopped shims are gone.

torchelastic waits for the processes it started (the shims); a SIGKILLed shim's worker is SIGKILLed by the
zygote a moment later. Here the zygote is stopped (SIGSTOP) while the shim is killed, so the worker outlives
its shim for as long as the test says: the wait must report it, then see it gone once the zygote runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
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

from fsdpkit.launcher.zygote import SHIM_PATH, Zygote

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


def _send_request(zygote: Zygote, argv: list[str], cwd: Path, *, output: int | None = None) -> socket.socket:
    """What the shim sends (training/launcher/shim.py): the request, with /dev/null as its stdin and as its
    stdout and stderr unless `output` (a file descriptor) is given for them."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    body = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(zygote.socket_path)
    with open(os.devnull, "r+b") as null:
        out = null.fileno() if output is None else output
        socket.send_fds(conn, [struct.pack("!I", len(body))], [null.fileno(), out, out])
    conn.sendall(body)
    return conn


def _read_until_closed(fd: int, timeout_s: float) -> bytes:
    """What was written to the pipe `fd` until every process holding its write end has exited (EOF)."""
    out = b""
    deadline = time.monotonic() + timeout_s
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the pipe still open after {timeout_s:g} s (an orphaned worker?); read: {out!r}"
        chunk = os.read(fd, 4096)
        if not chunk:
            return out
        out += chunk


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_shim_gone_before_its_reply_takes_its_worker_and_the_zygote_serves_on(
    zygote: Zygote, tmp_path: Path
) -> None:
    """A shim that dies between its request and the zygote's reply (its group stopped as it starts): the
    reply fails (EPIPE), and the zygote must kill the worker it forked and serve on, or that worker would run
    on, orphaned, and every later shim would find no zygote. The zygote is stopped while a shim's request
    arrives and the shim hangs up, so the reply is sure to fail. The doomed worker's stdout is a pipe: its
    end of file says that the worker, and anything it started, has exited."""
    script = tmp_path / "pid_then_sleep.py"
    script.write_text("import os, time\nos.write(1, b'%d ' % os.getpid())\ntime.sleep(60)")  # fd 1: the pipe
    read_end, write_end = os.pipe()
    try:
        os.kill(zygote.pid, signal.SIGSTOP)
        _send_request(zygote, [str(script)], tmp_path, output=write_end).close()
        os.close(write_end)  # from now on only the zygote and its worker hold it
        os.kill(zygote.pid, signal.SIGCONT)
        # The zygote handles requests in order: once a later one has its reply, the first was handled.
        with _send_request(zygote, [str(script)], tmp_path) as later:
            later.settimeout(30)
            reply = later.makefile("rb").readline()
            assert reply, "the zygote closed the connection: it crashed on the first request"
            worker = json.loads(reply)["pid"]
            doomed = _read_until_closed(read_end, timeout_s=30).split()
            assert all(_gone(int(pid)) for pid in doomed), doomed  # printed its pid at most, then was killed
            deadline = time.monotonic() + 10
            while (live := zygote.live_workers()) != [worker] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert live == [worker]
    finally:
        os.close(read_end)
    assert zygote.wait_workers_gone(10) == []  # the later shim hung up too: its worker is killed
