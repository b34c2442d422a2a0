"""The launcher's learned heartbeat timeout against the real trainer (FSDP2 on gloo, async checkpoints): slow
steps that overlap a background save must never look like a hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import REPO, TINY, trainer_env

from fsdpkit.contracts import exitcodes
from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow
STEPS = 24
"""Past the launcher's 20 learning steps, so the final (not the provisional) timeout is in force."""


def test_fault_free_run_with_async_saves_has_no_false_restart(tmp_path: Path) -> None:
    # A save every 2 steps: every other step overlaps a background write. Default heartbeat flags.
    root = tmp_path / "runs"
    cmd = [
        sys.executable, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "0",
        "--log-dir", str(tmp_path / "logs"), "--run-dir", str(root / "free"),
        "-m", "fsdpkit.trainer", "--run.id", "free", "--run.root", str(root), *TINY,
        "--training.steps", str(STEPS), "--checkpoint.mode", "async", "--checkpoint.interval", "2",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env=trainer_env(tmp_path), capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == exitcodes.OK, proc.stderr[-4000:]
    events = read_events(root / "free")
    assert [e for e in events if e["kind"] in ("hang_detected", "worker_failed", "restart")] == []
    assert sorted(e["rank"] for e in events if e["kind"] == "end" and e["step"] == STEPS) == [0, 1]
    saves = {e["step"] for e in events if e["kind"] == "ckpt" and e["phase"] == "commit"}
    assert len(saves) >= STEPS // 2 - 1  # the run really overlapped saves with steps
