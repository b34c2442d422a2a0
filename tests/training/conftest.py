"""Fixtures shared by the trainer and launcher tests (helpers live in trainer_helpers.py: a conftest is
not importable by name when several test folders have one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REF_STEPS, TINY, run_trainer


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fault-free 2-rank run of REF_STEPS steps that saves only its final step; returns its run folder."""
    tmp = tmp_path_factory.mktemp("reference")
    run_trainer(
        tmp,
        [
            "--run.id", "reference", "--run.root", str(tmp / "runs"), *TINY,
            "--training.steps", str(REF_STEPS), "--checkpoint.mode", "sync",
            "--checkpoint.interval", str(REF_STEPS),
        ],
    ).check()  # fmt: skip
    return tmp / "runs" / "reference"
