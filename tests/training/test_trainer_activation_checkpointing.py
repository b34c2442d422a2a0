"""Activation checkpointing changes memory, never results: each mode ends bitwise where the reference run
without checkpointing ends (persisted final checkpoints, value by value); selective is also stopped and
resumed from disk (test_trainer_resume.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, assert_same_final_checkpoint, run_trainer

from fsdpkit.trainer.model import checkpointed_blocks

pytestmark = pytest.mark.slow


def test_full_activation_checkpointing_gives_the_reference_model(tmp_path: Path, reference_run: Path) -> None:
    """Every block wrapped; the stop-and-resume case runs with selective checkpointing in
    test_trainer_resume.py (both kinds of block, wrapped and not, through a resume)."""
    root = tmp_path / "runs"
    run_trainer(
        tmp_path,
        [
            "--run.id", "ac-full", "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS),
            "--checkpoint.mode", "async", "--checkpoint.interval", "4",
            "--model.activation_checkpointing", "full",
        ],
    ).check()  # fmt: skip
    assert_same_final_checkpoint(root / "ac-full", reference_run)


def test_checkpointed_blocks_follow_torchtitan_per_layer_frequency() -> None:
    assert checkpointed_blocks(4, "none") == [False] * 4
    assert checkpointed_blocks(4, "selective") == [False, True, False, True]
    assert checkpointed_blocks(5, "selective") == [False, True, False, True, False]
    assert checkpointed_blocks(3, "full") == [True] * 3
