"""Activation checkpointing changes memory, never results: each mode, stopped and resumed from disk, ends
bitwise where the reference run without checkpointing ends (persisted final checkpoints, value by value)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, assert_same_final_checkpoint, run_trainer

from training.model import checkpointed_blocks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_resumes_bitwise_equal(
    tmp_path: Path, reference_run: Path, mode: str
) -> None:
    root = tmp_path / "runs"
    common = [
        "--run.id", f"ac-{mode}", "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS),
        "--checkpoint.mode", "async", "--checkpoint.interval", "4", "--model.activation_checkpointing", mode,
    ]  # fmt: skip
    run_trainer(tmp_path, [*common, "--training.stop_at", str(REF_STEPS // 2)]).check()
    run_trainer(tmp_path, common).check()
    assert_same_final_checkpoint(root / f"ac-{mode}", reference_run)


def test_checkpointed_blocks_follow_torchtitan_per_layer_frequency() -> None:
    assert checkpointed_blocks(4, "none") == [False] * 4
    assert checkpointed_blocks(4, "selective") == [False, True, False, True]
    assert checkpointed_blocks(5, "selective") == [False, True, False, True, False]
    assert checkpointed_blocks(3, "full") == [True] * 3
