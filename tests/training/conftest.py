"""Fixtures shared by the trainer and launcher tests (helpers live in trainer_helpers.py: a conftest is
not importable by name when several test folders have one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import ELASTIC, REF_STEPS, TINY, run_trainer


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


@pytest.fixture(scope="session")
def elastic_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fault-free 4-rank run of the ELASTIC job (12 samples per optimizer step: 3 micro-batches of 1 per
    rank); returns its run folder: what a run that changes its world size must consume, step by step."""
    tmp = tmp_path_factory.mktemp("elastic-reference")
    args = ["--run.id", "elastic-ref", "--run.root", str(tmp / "runs"), *ELASTIC, "--checkpoint.mode", "off"]
    run_trainer(tmp, args, nproc=4).check()
    return tmp / "runs" / "elastic-ref"
