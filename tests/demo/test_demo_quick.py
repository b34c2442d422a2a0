"""`make demo` in its reduced form: the real local Job, real faults, the report's content checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_quick_demo_recovers_every_fault_and_ends_with_the_fault_free_model(tmp_path: Path) -> None:
    from demo.run import QUICK

    summary_path = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo",
            "--quick",
            "--workdir",
            str(tmp_path / "demo"),
            "--summary-json",
            str(summary_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Goodput report" in out and "Side by side" in out and "timeline:" in out

    runs = json.loads(summary_path.read_text(encoding="utf-8"))["runs"]
    kit, ref = runs["kit"], runs["reference"]
    assert kit["succeeded"] and ref["succeeded"]
    m = kit["metrics"]
    assert m["finished"] and m["steps_completed"] == QUICK.steps
    kinds = sorted(f["kind"] for f in m["faults"])
    assert kinds == sorted(part.split(":")[0] for part in QUICK.faults.split(","))
    assert m["faults_recovered"] == len(kinds)
    assert all(f["recovery_s"] is not None and f["recovery_s"] > 0 for f in m["faults"])
    assert {f["detected_by"] for f in m["faults"] if f["kind"] == "hang"} == {"hang_detected"}
    assert m["steps_computed"] >= m["steps_completed"]  # replays after resumes, never fewer steps
    assert ref["metrics"]["faults"] == [] and ref["metrics"]["steps_completed"] == QUICK.steps
    # The guarantee: faults change nothing but time.
    assert kit["same_final_as"] == {"reference": True}
    assert Path(kit["timeline_png"]).read_bytes()[:8] == PNG_MAGIC


def test_demo_refuses_a_workdir_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("user data", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "demo", "--quick", "--workdir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "was not made by the demo" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert (tmp_path / "precious.txt").exists()
