"""A script that fails in every attempt fails the Job, through the rendered manifests and the local runner
with the Job's own replacement pods (real launchers, gloo on CPU).

Each launcher spends its restarts and exits 75, and the one that closes the rendezvous records why; the
Job's replacement of a failed index (or a node re-joining) finds the run closed by a failure and exits 69,
which the Job's pod failure policy maps to failing the Job: no index succeeds, `python -m fsdpkit.k8s
local` exits non-zero with the reason in one line, and the run's events and metrics say the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpkit.analysis import metrics
from fsdpkit.contracts import exitcodes

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = """import sys
from fsdpkit import resilience


def build(job, *, init_weights):
    raise RuntimeError("the script fails in every attempt")


def train(job, session):
    raise AssertionError("never reached")


resilience.leave(resilience.run(resilience.load_config(sys.argv[1:]), build=build, train=train))
"""
FAILED_LINE = re.compile(
    r"local job failed: pod failrun-\d-local(-r\d)? exited 69 \(FailJob\): kit-launch: the run failed "
    r"(before this pod was needed|while this node re-joined): node \d \(pod failrun-\d-local\) exited 75: "
    r"restart budget exhausted \(--max-restarts=1\); last failure: rank \d .*; raise --max-restarts or fix "
    r"the cause; exiting 69: the Job fails \(a new pod cannot help\)"
)


def test_a_script_that_fails_in_every_attempt_fails_the_job(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT, encoding="utf-8")
    argv = [sys.executable, "-m", "fsdpkit.k8s", "local", "NODES=2", "STEPS=4", "MAX_RESTARTS=1",
            "BACKOFF_LIMIT_PER_INDEX=1", "INPROCESS=false", "MONITOR_INTERVAL_S=0.1", "RUN_ID=failrun",
            f"ENTRYPOINT=python {script}", "--workdir", str(tmp_path), "--timeout", "240"]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=280,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:] + proc.stderr[-2000:]
    assert "local job completed" not in out
    [failed] = [line for line in out.splitlines() if line.startswith("local job failed: ")]
    assert FAILED_LINE.fullmatch(failed), failed
    codes = [int(c) for c in re.findall(r"^pod failrun-\d-local\S*: exit code (-?\d+)", out, re.M)]
    assert exitcodes.RUN_FAILED in codes and exitcodes.OK not in codes, out[-3000:]  # no index succeeded
    # The run's own record says the same: every launcher's exit is a failure, and no step was trained.
    run_dir = tmp_path / "failrun" / "volumes" / "kit-local-runs" / "runs" / "failrun"
    exits = [e for e in metrics.load_events(run_dir) if e["kind"] == "exit" and e.get("role") == "launcher"]
    assert {exitcodes.BUDGET_EXHAUSTED, exitcodes.RUN_FAILED} <= {e["code"] for e in exits}
    assert all(e["code"] != exitcodes.OK for e in exits)
    report = subprocess.run(
        [sys.executable, "-m", "fsdpkit.analysis.report", str(run_dir), "--json"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    m = json.loads(report.stdout)
    assert (m["finished"], m["steps_completed"]) == (False, 0)
    budget = f"failed: exit {exitcodes.BUDGET_EXHAUSTED}: restart budget exhausted"
    assert m["outcome"].startswith(budget), m["outcome"]
