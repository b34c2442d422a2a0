"""`make demo` in its reduced form: the real local Job, real faults, the report's content checked, and the
live metrics the run's trainer and launcher wrote read back as CloudWatch would read them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpkit.analysis.metrics import NOT_FAILURES
from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.resilience.faults import parse_spec
from tests.fixtures.emf_spec import parse_event

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
    assert "Side by side" in out and out.rstrip().splitlines()[-1].startswith("timeline: ")

    runs = json.loads(summary_path.read_text(encoding="utf-8"))["runs"]
    kit, ref = runs["kit"], runs["reference"]
    assert kit["succeeded"] and ref["succeeded"]
    m = kit["metrics"]
    assert m["finished"] and m["steps_completed"] == QUICK.steps
    kinds = sorted(f["kind"] for f in m["faults"])
    planned = parse_spec(QUICK.faults)
    assert kinds == sorted(f.kind for f in planned if f.kind not in NOT_FAILURES)  # a straggler fails nothing
    # ... it is found and named: its rank, on node 0 (the one pod), with policy report (nothing evicted)
    (slow,) = [f for f in planned if f.kind == "slow"]
    (straggler,) = m["stragglers"]
    assert (straggler["rank"], straggler["node"], straggler["evicted"]) == (slow.rank, 0, False)
    assert straggler["step"] > straggler["since_step"] >= slow.step
    named = f"straggler: rank {slow.rank} on node 0, "
    assert len([line for line in out.splitlines() if line.strip().startswith(named)]) == 1, out
    assert m["faults_recovered"] == len(kinds)
    assert all(f["recovery_s"] is not None and f["recovery_s"] > 0 for f in m["faults"])
    assert {f["detected_by"] for f in m["faults"] if f["kind"] == "hang"} == {"hang_detected"}
    assert m["steps_computed"] >= m["steps_completed"]  # replays after resumes, never fewer steps
    assert ref["metrics"]["faults"] == [] and ref["metrics"]["steps_completed"] == QUICK.steps
    assert ref["metrics"]["stragglers"] == []  # the same detector, no slow rank: no false alarm
    # The guarantee: faults change nothing but time.
    assert kit["same_final_as"] == {"reference": True}
    assert Path(kit["timeline_png"]).read_bytes()[:8] == PNG_MAGIC
    # Quiet: one line per injected fault, the killed ranks' tracebacks in the pods' logs only.
    assert len(out.splitlines()) < 40, out
    assert "Traceback" not in out and "Connection reset" not in out and "gloo" not in out
    for kind in kinds:
        assert len([line for line in out.splitlines() if line.strip().startswith(f"{kind} on rank 1")]) == 1
    check_live_metrics(Path(kit["run_dir"]), steps=QUICK.steps, job="demo-kit")


def check_live_metrics(run_dir: Path, *, steps: int, job: str) -> None:
    """The EMF records of the run, parsed by the specification's rules: every metric the run must have
    produced, under the catalog's dimensions, and every alarm's series among them (one source of names)."""
    data = [
        datum
        for path in sorted((run_dir / "metrics").glob("*.emf.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        for datum in parse_event(line)
    ]
    assert {d.namespace for d in data} == {catalog.NAMESPACE}
    series = {(d.name, tuple(k for k, _ in d.dimensions)) for d in data}
    by_name = {}
    keys = {(catalog.CLUSTER, catalog.JOB), (catalog.CLUSTER,)}
    keys |= {(*k, catalog.FAULT_CLASS) for k in keys}
    for d in data:
        by_name.setdefault(d.name, []).append(d)
        assert tuple(k for k, _ in d.dimensions) in keys, d
        assert (
            dict(d.dimensions)[catalog.CLUSTER] == "local" and dict(d.dimensions).get(catalog.JOB, job) == job
        )
    # CPU (no MFU) and no spares (no SparesWaiting): everything else the catalog names.
    assert set(by_name) == {m.name for m in catalog.METRICS} - {catalog.MFU.name, catalog.SPARES_WAITING.name}
    assert max(d.value for d in by_name["Step"]) == steps
    faults = sorted(
        dict(d.dimensions)[catalog.FAULT_CLASS] for d in by_name["Faults"] if len(d.dimensions) == 2
    )
    assert faults == ["hard", "silent"]  # the kill and the hang; the exception restarts in process
    assert (
        sum(d.value for d in by_name["InprocessRestarts"] if len(d.dimensions) == 1) == 2
    )  # exception, hang
    assert all(d.value > 0 for d in by_name["RecoverySeconds"])
    assert all(0 < d.value <= 100 for d in by_name["Goodput"])
    for rule in catalog.alarm_rules(catalog.AlarmThresholds()):
        if rule.metric is not catalog.SPARES_WAITING:
            assert (rule.metric.name, (catalog.CLUSTER,)) in series, rule.key


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
