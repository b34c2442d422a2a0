"""A fault at every phase of an async save (staging, writing, committing), each fault kind, recovered in
process (an exception; a hang, interrupted by the launcher) or by a restart of the group (a kill): the
persisted final checkpoint equals the fault-free run's and resumes.

The save is put in the phase deterministically: the test-only hold (KIT_CKPT_TEST_HOLD, see
training/resilience/checkpoint/guard.py) stops the save of a step at the start of a phase until it is
abandoned or
its process dies, and the fault fires at the top of the next step. One run per (kind, in-process restart)
carries all three phases: step 2 held in staging, fault at 3 (rank 1): the first save of the process,
nothing committed yet, the host copy torn; step 4 held in writing, fault at 5 (rank 0); step 6 held in
committing (rank 0's commit), fault at 7 (rank 1). With in-process restart each fault resumes from the
live state of the step whose save it abandoned, and that step is saved again at once: the abandoned save
never commits, the new one does. Each fault fires once, so each step of a fault carries one fault only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import assert_resumes_from_final, assert_same_final_checkpoint, launch_trainer

from fsdpkit.resilience.checkpoint.commit import expected_files, read_commit
from fsdpkit.resilience.checkpoint.compare import load_committed
from fsdpkit.resilience.checkpoint.layout import is_committed, list_steps, step_dir
from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow
HOLDS = "staging@2,writing@4,committing@6"


def _faults(kind: str) -> str:
    return f"{kind}:step=3:rank=1,{kind}:step=5:rank=0,{kind}:step=7:rank=1"


@pytest.mark.parametrize(
    ("kind", "inprocess"),
    # An exception and a hang (interrupted by the launcher: fsdpkit.runtime.hang_interrupt) are recovered
    # in
    # process; a kill always restarts the group (the peer's in-process attempt waits for a rank that is
    # gone), so it runs with in-process restart off: the group-restart path, which an exception or a hang
    # would take with it off, from the same held saves.
    [("exception", True), ("hang", True), ("kill", False)],
)
def test_fault_in_every_phase_of_a_save_leaves_the_fault_free_checkpoint(
    tmp_path: Path, reference_run: Path, kind: str, inprocess: bool
) -> None:
    # Four faults of this node's own on purpose: never give the node up (--node-failure-limit 0).
    launcher = ["--max-restarts", "4", "--node-failure-limit", "0"]
    launcher += ["--heartbeat-timeout", "2"] if kind == "hang" else []
    run_dir, args = launch_trainer(
        tmp_path,
        f"{kind}-{'inproc' if inprocess else 'group'}",
        launcher,
        [
            "--checkpoint.mode", "async", "--checkpoint.interval", "2",
            "--inprocess.enabled", str(inprocess).lower(), "--inprocess.barrier_timeout_s", "30",
            "--fault.spec", _faults(kind),
        ],
        env={"KIT_CKPT_TEST_HOLD": HOLDS},
    )  # fmt: skip
    events = read_events(run_dir)
    assert len([e for e in events if e["kind"] == "fault"]) == 3
    held = sorted(p.name for p in (run_dir / "test_holds").iterdir())
    assert held == sorted(f"{h.replace('@', '-step')}-rank{r}" for h in HOLDS.split(",") for r in (0, 1))
    if inprocess:
        restarts = [e for e in events if e["kind"] == "inprocess_restart" and e["rank"] == 0]
        restored = [(e["restored_step"], e["source"]) for e in restarts]
        assert restored == [(2, "live"), (4, "live"), (6, "live")]
        abandoned = [e for e in events if e["kind"] == "ckpt" and "abandoned" in str(e.get("error"))]
        assert {e["step"] for e in abandoned if e["rank"] == 0} == {2, 4, 6}
        commits = [e for e in events if e["kind"] == "ckpt" and e["phase"] == "commit"]
        for restart in restarts:  # the resumed step is saved again, and that save commits
            began = restart["ts"] - restart["duration_s"]
            assert any(e["step"] == restart["restored_step"] and e["ts"] > began for e in commits), restart
        assert [e for e in events if e["kind"] == "restart"] == [], "all three recovered in process"
        if kind == "hang":
            assert [e["action"] for e in events if e["kind"] == "hang_detected"] == ["interrupt"] * 3
    else:
        assert len([e for e in events if e["kind"] == "restart"]) == 3
    assert_same_final_checkpoint(run_dir, reference_run)
    if kind == "exception":  # it re-saves abandoned steps: start the job again once (one case: time)
        assert_resumes_from_final(tmp_path, args, run_dir)


# Fault-free slow saves need no run of their own: the fault-case run has them before and after its fault.
@pytest.mark.parametrize("backend", ["kit", "dcp"])
def test_slow_saves_cause_no_restart_and_an_in_process_restart_corrupts_no_later_checkpoint(
    tmp_path: Path, reference_run: Path, backend: str
) -> None:
    # The schedule: the step-4 save is still being staged (every tensor copy and write slowed) when
    # rank 0 raises at step 5. Fault-free, the same slow saves span several step times (measured: the
    # optimizer waits ~1.5 s for the host copy, steps take ~0.3 s): every wait is in the heartbeat's
    # "checkpoint" phase, so no false hang.
    run_dir, args = launch_trainer(
        tmp_path,
        f"slow-{backend}",
        [],
        [
            "--checkpoint.mode", "async", "--checkpoint.backend", backend, "--checkpoint.interval", "4",
            "--inprocess.enabled", "true", "--fault.spec", "exception:step=5:rank=0",
        ],
        env={"KIT_CKPT_TEST_DELAY_S": "0.01"},
    )  # fmt: skip
    events = read_events(run_dir)
    assert [e for e in events if e["kind"] in ("restart", "hang_detected")] == []
    root = run_dir / "checkpoints"
    for step in list_steps(root):
        if is_committed(root, step):
            assert set(read_commit(step_dir(root, step)).files) == expected_files(2)
            load_committed(step_dir(root, step))  # verifies every file
    assert_same_final_checkpoint(run_dir, reference_run)
    if backend == "dcp":
        assert_resumes_from_final(tmp_path, args, run_dir)
