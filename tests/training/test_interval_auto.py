"""`checkpoint.interval: auto` on 2 real ranks (gloo) with a fault: the interval rank 0 chose from its
measurements reaches every rank at the same step (both save the same steps), it stays within its bounds,
it changes once a save is measured, a fault that rolls work back is counted (one resumed from the live state
is not: tests/training/checkpoint/test_interval.py), and the final checkpoint on disk is bitwise the
fault-free run's (checkpoint steps do not change the math)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, assert_same_final_checkpoint, run_trainer

from fsdpkit.analysis.metrics import load_run_metrics
from fsdpkit.resilience.checkpoint.interval import INTERVAL_EVENT
from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow

LO, HI = 2, 6
WEEK_S = 7 * 24 * 3600


def test_auto_interval_agrees_on_every_rank_and_a_fault_changes_nothing(
    tmp_path: Path, reference_run: Path
) -> None:
    root = tmp_path / "runs"
    run_dir = root / "auto"
    done = run_trainer(
        tmp_path,
        [
            "--run.id", "auto", "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS),
            "--inprocess.enabled", "true", "--inprocess.barrier_timeout_s", "60",
            "--checkpoint.mode", "async", "--checkpoint.interval", "auto",
            "--checkpoint.interval_min", str(LO), "--checkpoint.interval_max", str(HI),
            # a week's MTBF puts the optimum far above HI for any measured cost: the choice must move to HI
            "--checkpoint.mtbf_s", str(WEEK_S),
        ],
        # mid-update (after its optimizer step): the live state is torn, the restart rolls back to a save
        env={"KIT_FAULT_TEST_IN_UPDATE": "exception:step=7:rank=1"},
    ).check()  # fmt: skip
    events = read_events(run_dir)

    chosen = [e for e in events if e["kind"] == INTERVAL_EVENT]
    assert {e["rank"] for e in chosen} == {0}, "only rank 0 chooses"
    assert [e["interval"] for e in chosen][:2] == [LO, HI], chosen
    assert chosen[0]["reason"] == "start" and chosen[1]["reason"] == "measured"
    assert all(LO <= e["interval"] <= HI for e in chosen)
    measured = chosen[1]
    assert measured["cost_s"] > 0 and measured["step_s"] > 0 and measured["faults_seen"] == 0
    assert measured["optimum_s"] > HI * measured["step_s"]
    (after,) = [e for e in chosen if e["reason"] == "history"]  # the in-process restart's new checkpointer
    assert after["faults_seen"] == 1 and after["interval"] == HI
    assert WEEK_S / 2 < after["mtbf_s"] < measured["mtbf_s"], "one fault halves the prior's weight"
    assert "checkpoint interval auto: 6 steps (was 2; save cost" in done.stdout

    stalls = [e for e in events if e["kind"] == "ckpt" and e["phase"] == "stall" and "waited" not in e]
    saved = {rank: [e["step"] for e in stalls if e["rank"] == rank] for rank in (0, 1)}
    assert saved[0] == saved[1], "a checkpoint is a collective: every rank saves the same steps"
    assert saved[0][0] == LO and saved[0][-1] == REF_STEPS
    metrics = load_run_metrics(run_dir)  # the metrics read a run with interval events
    assert metrics.finished and len(metrics.faults) == 1 and metrics.steps_completed == REF_STEPS
    assert_same_final_checkpoint(run_dir, reference_run)
