"""The real trainer (FSDP2 on gloo, async checkpoints) under the kit launcher: faults change nothing but
time. Each run's persisted final checkpoint, loaded back from disk, must equal the fault-free reference
run's value by value (`reference_run` in conftest.py: same seed, data and world size, no launcher), and
the job started again must resume from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import assert_resumes_from_final, assert_same_final_checkpoint, launch_trainer

from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow


def test_sigkill_mid_run_while_a_checkpoint_is_written_gives_the_fault_free_model(
    tmp_path: Path, reference_run: Path
) -> None:
    # The step-4 save is handed to the background writer at the end of step 4; rank 1 is SIGKILLed at the
    # top of step 5, while that save is being written. Resume must use a committed step only, and the
    # final model must be the fault-free one.
    run_dir, args = launch_trainer(
        tmp_path,
        "kill",
        [],
        ["--checkpoint.mode", "async", "--checkpoint.interval", "4", "--fault.spec", "kill:step=5:rank=1"],
    )
    assert_same_final_checkpoint(run_dir, reference_run)
    events = read_events(run_dir)
    assert [e["exitcode"] for e in events if e["kind"] == "worker_failed" and e["global_rank"] == 1] == [-9]
    committed = {
        e["step"] for e in events if e["kind"] == "ckpt" and e["phase"] == "commit" and e["attempt"] == 0
    }
    resumed = {e["step"] for e in events if e["kind"] == "resume" and e["attempt"] == 1}
    assert len(resumed) == 1 and resumed <= committed | {None}
    assert [e["attempt"] for e in events if e["kind"] == "restart"] == [1]
    assert_resumes_from_final(tmp_path, args, run_dir)


def test_study_schedule_of_five_faults_completes_with_the_correct_model(
    tmp_path: Path, reference_run: Path
) -> None:
    # The study's generator (seed 42, 5 faults, exception 0.6 / hang 0.4), scaled to 12 steps on 2 ranks:
    # hang@3, exception@4, @7, @9, @12, all on rank 1, under the kit as deployed: the exceptions are
    # recovered in process, and so is the hang, which the heartbeat monitor finds and interrupts. (Group
    # restarts from the same kinds of fault: the phase matrix in test_fault_during_save.py.)
    run_dir, _ = launch_trainer(
        tmp_path,
        "schedule",
        ["--max-restarts", "6", "--heartbeat-timeout", "2"],
        [
            "--checkpoint.mode", "async", "--checkpoint.interval", "2", "--inprocess.enabled", "true",
            "--inprocess.max_restarts", "5",
            "--fault.schedule_seed", "42", "--fault.schedule_count", "5", "--fault.schedule_after_step", "2",
        ],
    )  # fmt: skip
    assert_same_final_checkpoint(run_dir, reference_run)
    events = read_events(run_dir)
    fired = [(e["fault"], e["step"], e["target_rank"]) for e in events if e["kind"] == "fault"]
    assert fired == [
        ("hang", 3, 1),
        ("exception", 4, 1),
        ("exception", 7, 1),
        ("exception", 9, 1),
        ("exception", 12, 1),
    ]
    # The hang's blame under the real trainer: torchelastic's `@record` wraps every rank's
    # main, so only the innermost frames say that rank 0 waits in a collective and rank 1 hangs elsewhere.
    (hang,) = [e for e in events if e["kind"] == "hang_detected"]
    assert hang["global_rank"] == 1 and hang["action"] == "interrupt", hang
    assert hang["ranks"] == {"0": "collective", "1": "elsewhere"} and hang["where"].startswith("faults.py:")
    assert [e for e in events if e["kind"] == "restart"] == []
    restarts = [e for e in events if e["kind"] == "inprocess_restart" and e["rank"] == 1]
    assert [e["restored_step"] for e in restarts] == [2, 3, 6, 8, 11]
