"""The launcher's hang interrupt (training/runtime/hang_interrupt.py) against a real worker process: a
rank hung at
Python level is interrupted in place and carries on in the same process; one stuck where no Python handler
runs (the signal blocked, as in C) is restarted with its group once the grace is over."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_launch_recovery import env_for, launcher_events

from fsdpkit.contracts import exitcodes

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from fsdpkit.runtime import hang_interrupt
    from fsdpkit.runtime.heartbeat import HeartbeatClient

    hb = HeartbeatClient.from_env()
    hb.phase("train")
    out = open(sys.argv[1], "a")
    step = 0

    def steps(n):
        global step
        for _ in range(n):
            time.sleep(0.05)
            step += 1
            hb.beat(step)

    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        steps(3)
        print(f"restarted pid={os.getpid()}", file=out, flush=True)
        hb.close()
        sys.exit(0)
    try:
        with hang_interrupt.armed(hb):
            steps(6)
            if sys.argv[2] == "stuck":  # no Python handler runs: a thread stuck in C
                signal.pthread_sigmask(signal.SIG_BLOCK, {hang_interrupt.INTERRUPT_SIGNAL})
            while True:
                time.sleep(3600)
    except hang_interrupt.HangInterrupted:
        hb.phase("load")
        steps(3)
        print(f"interrupted pid={os.getpid()}", file=out, flush=True)
        hb.close()
    """
)


@pytest.mark.parametrize("where", ["python", "stuck"])
def test_a_hung_rank_is_interrupted_in_place_or_restarted_after_the_grace(tmp_path: Path, where: str) -> None:
    script, out, run = tmp_path / "worker.py", tmp_path / "out.txt", tmp_path / "run"
    script.write_text(WORKER)
    cmd = [
        sys.executable, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node", "1",
        "--run-dir", str(run), "--heartbeat-timeout", "0.5", "--hang-interrupt-grace", "1",
        "--max-restarts", "1", str(script), str(out), where,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env_for(tmp_path, ""), capture_output=True, text=True, timeout=120)
    assert proc.returncode == exitcodes.OK, proc.stderr[-3000:]
    (hang,) = launcher_events(run, "hang_detected")
    assert hang["action"] == "interrupt" and hang["step"] == 6, hang
    restarts = [e["reason"] for e in launcher_events(run, "restart")]
    unanswered = launcher_events(run, "hang_interrupt_unanswered")
    if where == "python":
        assert out.read_text().startswith("interrupted"), out.read_text()
        assert restarts == [] and unanswered == []
        assert "answered the hang interrupt" in proc.stderr
    else:
        assert out.read_text().startswith("restarted"), out.read_text()
        assert [e["grace_s"] for e in unanswered] == [1.0]
        assert restarts == ["hang of rank 0"]
        assert "did not beat within 1 s of the hang interrupt" in proc.stderr
