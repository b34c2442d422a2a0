"""In-process restart: an exception on one rank is recovered inside the same processes; the persisted
final checkpoint equals the fault-free run's and resumes. An exception at the top of a step resumes from
the live state (nothing computed again); one raised right after a rank's optimizer step (the test hook
KIT_FAULT_TEST_IN_UPDATE, training/resilience/faults.py) leaves a torn live state, so every rank falls back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import (
    REF_STEPS,
    TINY,
    assert_resumes_from_final,
    assert_same_final_checkpoint,
    run_trainer,
)

from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow


def _run(tmp: Path, run_id: str, extra: list[str], *, in_update: str = "") -> tuple[Path, list[str]]:
    root = tmp / "runs"
    args = [
        "--run.id", run_id, "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS),
        "--inprocess.enabled", "true", "--inprocess.barrier_timeout_s", "60", *extra,
    ]  # fmt: skip
    run_trainer(tmp, args, env={"KIT_FAULT_TEST_IN_UPDATE": in_update}).check()
    return root / run_id, args


def _by_rank(events: list[dict], kind: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == kind and e["role"] == "trainer":
            out.setdefault(e["rank"], []).append(e)
    return out


def test_exception_resumes_live_and_mid_update_falls_back_to_host_memory(
    tmp_path: Path, reference_run: Path
) -> None:
    run_dir, args = _run(
        tmp_path,
        "inproc-mem",
        [
            "--checkpoint.mode",
            "async",
            "--checkpoint.interval",
            "4",
            "--fault.spec",
            "exception:step=7:rank=1",
        ],
        in_update="exception:step=10:rank=0",
    )
    events = read_events(run_dir)
    restarts = _by_rank(events, "inprocess_restart")
    assert sorted(restarts) == [0, 1], "both ranks restart twice: the faulty one and its peer"
    for rank, (live, fallback) in restarts.items():
        assert (live["source"], live["restored_step"], live["why"]) == ("live", 6, None), live
        assert (fallback["source"], fallback["restored_step"]) == ("memory", 8), fallback
        assert "rank 0: failed mid-update of step 10" in fallback["why"]
        assert "InjectedFault" in live["reason"] or rank == 0
        steps = [e for e in _by_rank(events, "step")[rank]]
        pids = {e["pid"] for e in steps}
        assert len(pids) == 1 and live["pid"] in pids, "same process before and after the restarts"
        done = [e["step"] for e in steps if e["ts"] < live["ts"]]
        after_live = [e["step"] for e in steps if live["ts"] < e["ts"] < fallback["ts"]]
        assert done == list(range(1, 7)) and after_live[0] == 7, "the live resume computes nothing again"
        replayed = [e["step"] for e in steps if e["ts"] > fallback["ts"]]
        assert replayed == list(range(9, REF_STEPS + 1))
    assert_same_final_checkpoint(run_dir, reference_run)
    assert_resumes_from_final(tmp_path, args, run_dir)


def test_mid_update_exception_before_any_checkpoint_restarts_from_the_seed(
    tmp_path: Path, reference_run: Path
) -> None:
    run_dir, _ = _run(
        tmp_path,
        "inproc-none",
        [
            "--checkpoint.mode",
            "sync",
            "--checkpoint.interval",
            "6",
        ],
        in_update="exception:step=3:rank=0",
    )
    restarts = _by_rank(read_events(run_dir), "inprocess_restart")
    assert {r: [e["source"] for e in v] for r, v in restarts.items()} == {0: ["none"], 1: ["none"]}
    assert_same_final_checkpoint(run_dir, reference_run)
