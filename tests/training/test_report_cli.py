"""`python -m fsdpkit.analysis.report` run as a real process on synthetic run folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from metrics_fixtures import T0, SyntheticRun, fault_free_run

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsdpkit.analysis.report", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def faulted_run(run_dir: Path) -> None:
    run = SyntheticRun(run_dir)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 5, T0 + 1.0, 0.5)
    run.ckpt(5, "stall", t + 0.1, 0.1)
    run.ckpt(5, "commit", t + 0.5, 0.0, ranks=[0])
    t = run.steps(6, 7, t + 0.1, 0.5)
    run.fault("kill", 8, 1, t)
    run.launcher_event("worker_failed", t + 0.3, local_rank=1, global_rank=1, exitcode=-9, reason="signal")
    run.launcher_event("restart", t + 0.4, attempt=1, reason="worker_failed", remaining=1)
    run.start_attempt(1, t + 2.0, resume_step=5, resume_ts=t + 3.0)
    end = run.steps(6, 10, t + 3.0, 0.5)
    run.end(10, end)
    run.close()


def test_table_fault_rows_and_png(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-a"
    faulted_run(run_dir)
    png = tmp_path / "out" / "t.png"
    proc = report(str(run_dir), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "steps completed" in out and "Faults" in out
    assert "worker_failed" in out and "5 (shared)" in out  # the fault row: detector and resume point
    assert "restored from" in out and "shared 1" in out
    assert f"timeline: {png}" in out
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def test_json_output_carries_every_field(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-b"
    faulted_run(run_dir)
    proc = report(str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["steps_completed"], data["steps_computed"], data["lost_steps"]) == (10, 12, 2)
    assert data["faults"][0]["kind"] == "kill"
    assert data["faults"][0]["detect_s"] == pytest.approx(0.3)
    assert data["restarts"] == 1
    png = Path(data["timeline_png"])
    assert png == run_dir / "timeline.png" and png.read_bytes()[:8] == PNG_MAGIC


def test_no_faults_prints_no_fault_table(tmp_path: Path) -> None:
    fault_free_run(tmp_path / "run-c")
    proc = report(str(tmp_path / "run-c"), "--no-png")
    assert proc.returncode == 0, proc.stderr
    assert "Faults" not in proc.stdout and "timeline:" not in proc.stdout
    assert not (tmp_path / "run-c" / "timeline.png").exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "has no events"),
    ],
)
def test_bad_run_dir_is_one_line_error(tmp_path: Path, make, message: str) -> None:
    proc = report(str(make(tmp_path)))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_unwritable_png_is_one_line_error(tmp_path: Path) -> None:
    fault_free_run(tmp_path / "run-d")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = report(str(tmp_path / "run-d"), "--png", str(blocker / "t.png"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: --png={str(blocker / 't.png')!r}: {str(blocker)!r} is a file, not")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
