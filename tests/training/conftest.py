"""Fixtures shared by the trainer and launcher tests (helpers live in trainer_helpers.py: a conftest is
not importable by name when several test folders have one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, run_trainer


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fault-free 2-rank run of REF_STEPS steps without checkpoints; returns its final dump."""
    tmp = tmp_path_factory.mktemp("reference")
    dump = tmp / "final.pt"
    run_trainer(
        tmp,
        [
            "--run.id", "reference", "--run.root", str(tmp / "runs"), *TINY,
            "--training.steps", str(REF_STEPS), "--checkpoint.mode", "off",
            "--training.dump_final", str(dump),
        ],
    ).check()  # fmt: skip
    return dump
