"""Resume is bitwise: N steps in one go == N/2 steps, stop, resume, finish (the persisted final checkpoint,
value by value). A resume on another world size: tests/training/test_trainer_reshard.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, assert_same_final_checkpoint, run_trainer

from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow


def test_stop_and_resume_is_bitwise_equal_to_an_uninterrupted_run(
    tmp_path: Path, reference_run: Path
) -> None:
    """With selective activation checkpointing (every other block wrapped), so the same stop and resume
    also shows that the wrapper changes no checkpoint key and no result (the reference runs without it)."""
    root = tmp_path / "runs"
    common = [
        "--run.id", "resume", "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS),
        "--checkpoint.mode", "async", "--checkpoint.interval", "4",
        "--model.activation_checkpointing", "selective",
    ]  # fmt: skip
    half = REF_STEPS // 2
    run_trainer(tmp_path, [*common, "--training.stop_at", str(half)]).check()
    run_trainer(tmp_path, common).check()

    events = read_events(root / "resume")
    resumes = [e for e in events if e["kind"] == "resume" and e["rank"] == 0]
    assert [(e["step"], e["source"]) for e in resumes] == [(None, "none"), (half, "shared")]
    steps = [e["step"] for e in events if e["kind"] == "step" and e["rank"] == 0]
    assert steps == list(range(1, REF_STEPS + 1)), "no step computed twice, none skipped"
    assert_same_final_checkpoint(root / "resume", reference_run)
