"""In-process restart: an exception on one rank is recovered inside the same processes; the persisted
final checkpoint equals the fault-free run's and resumes."""

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

from training.events import read_events

pytestmark = pytest.mark.slow


def _run(tmp: Path, run_id: str, extra: list[str]) -> tuple[Path, list[str]]:
    root = tmp / "runs"
    args = [
        "--run.id", run_id, "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS),
        "--inprocess.enabled", "true", "--inprocess.barrier_timeout_s", "60", *extra,
    ]  # fmt: skip
    run_trainer(tmp, args).check()
    return root / run_id, args


def _by_rank(events: list[dict], kind: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == kind and e["role"] == "trainer":
            out.setdefault(e["rank"], []).append(e)
    return out


def test_exception_recovered_in_process_from_host_memory(tmp_path: Path, reference_run: Path) -> None:
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
    )
    events = read_events(run_dir)
    restarts = _by_rank(events, "inprocess_restart")
    assert sorted(restarts) == [0, 1], "both ranks restart once: the faulty one and its peer"
    for rank, (restart,) in restarts.items():
        assert restart["source"] == "memory", restart
        assert restart["restored_step"] == 4
        assert "InjectedFault" in restart["reason"] or rank == 0
        steps = [e for e in _by_rank(events, "step")[rank]]
        pids = {e["pid"] for e in steps}
        assert len(pids) == 1 and restart["pid"] in pids, "same process before and after the restart"
        replayed = [e["step"] for e in steps if e["ts"] > restart["ts"]]
        assert replayed == list(range(5, REF_STEPS + 1))
    assert_same_final_checkpoint(run_dir, reference_run)
    assert_resumes_from_final(tmp_path, args, run_dir)


def test_exception_before_any_checkpoint_restarts_from_the_seed(tmp_path: Path, reference_run: Path) -> None:
    run_dir, args = _run(
        tmp_path,
        "inproc-none",
        [
            "--checkpoint.mode",
            "sync",
            "--checkpoint.interval",
            "6",
            "--fault.spec",
            "exception:step=3:rank=0",
        ],
    )
    restarts = _by_rank(read_events(run_dir), "inprocess_restart")
    assert {r: [e["source"] for e in v] for r, v in restarts.items()} == {0: ["none"], 1: ["none"]}
    assert_same_final_checkpoint(run_dir, reference_run)
    assert_resumes_from_final(tmp_path, args, run_dir)
