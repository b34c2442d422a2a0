"""Resume is bitwise: N steps in one go == N/2 steps, stop, resume, finish (the persisted final checkpoint,
value by value)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, assert_same_final_checkpoint, run_cli, run_trainer

from training import exitcodes
from training.events import read_events
from training.resilience.checkpoint.commit import CommitRecord, FileEntry, expected_files, write_commit
from training.resilience.checkpoint.layout import checkpoints_dir, step_dir

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


def test_a_checkpoint_of_another_world_size_is_refused_before_any_process_group(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    folder = step_dir(checkpoints_dir(root / "resized"), 4)
    folder.mkdir(parents=True)
    entry = FileEntry(size=0, crc32=0)
    files = {name: entry for name in expected_files(2)}
    write_commit(folder, CommitRecord(step=4, world_size=2, files=files))
    done = run_cli(tmp_path, ["--run.id", "resized", "--run.root", str(root), *TINY, "--training.steps", "8"])
    assert done.returncode == exitcodes.FATAL_CONFIG
    (line,) = done.stderr.strip().splitlines()
    assert "was written by 2 rank(s), this job has 1: resume it on 2 rank(s)" in line
    assert not (root / "resized" / "events").exists(), "refused before anything ran"
