"""Stopping a local pod ends every process it started, as a container's end does, also workers that a
launcher put in sessions of their own (torchrun does) and that ignore SIGTERM (real processes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fsdpkit.k8s.local import LocalJob, LocalRunner

# A "launcher" that starts a worker in a new session; the worker ignores SIGTERM, writes its pid, sleeps.
LAUNCHER = """
import subprocess, sys, time
worker = "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \\
         "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
subprocess.Popen([sys.executable, "-c", worker, sys.argv[1]], start_new_session=True)
time.sleep(120)
"""


def _job(*, grace_s: float) -> LocalJob:
    """A Job of one pod with no volumes: what the runner needs to stop a pod is its grace period."""
    return LocalJob(
        name="stop", completions=1, backoff_limit_per_index=0, fail_job_codes=frozenset(), grace_s=grace_s,
        container={}, pod_meta={}, namespace="default", volumes={}, configmaps={},
    )  # fmt: skip


def test_stop_kills_workers_in_their_own_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    pod = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pid_file)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
    worker = psutil.Process(int(pid_file.read_text()))
    assert worker.is_running() and os.getsid(worker.pid) != os.getsid(pod.pid)

    runner = LocalRunner(_job(grace_s=1.0), workdir=tmp_path / "runner")
    try:
        runner._stop([pod])
    finally:
        shutil.rmtree(runner.memory_root, ignore_errors=True)

    assert pod.poll() is not None
    worker.wait(timeout=10)  # raises psutil.TimeoutExpired if the worker outlived its pod
