"""Fixtures for every test folder: the memory that stands in for each pod's /dev/shm."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM = Path("/dev/shm")


@pytest.fixture(scope="session", autouse=True)
def shm_root() -> Iterator[Path]:
    """Kit launchers started by the tests make their node's memory-tier folder under a folder of this
    session's (KIT_TIER_BASE), removed at the end: a launcher killed with its pod (the `node` fault) leaves
    its folder behind, as a pod's memory would be freed by Kubernetes."""
    base = Path(tempfile.mkdtemp(prefix="kit-test-tiers-", dir=SHM if SHM.is_dir() else None))
    previous = os.environ.get("KIT_TIER_BASE")
    os.environ["KIT_TIER_BASE"] = str(base)
    try:
        yield base
    finally:
        if previous is None:
            os.environ.pop("KIT_TIER_BASE", None)
        else:
            os.environ["KIT_TIER_BASE"] = previous
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shm_dir(shm_root: Path, request: pytest.FixtureRequest) -> Path:
    """A memory-backed folder for one test (or one module's fixtures)."""
    folder = shm_root / "t" / request.node.name.replace("/", "_")[:80]
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def elastic_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fault-free 4-rank run of the elastic tests' job (tests/elastic_job.py); its run folder: what a run
    that changes its world size must consume, step by step."""
    from elastic_job import run_reference

    return run_reference(tmp_path_factory.mktemp("elastic-reference"))


@pytest.fixture(scope="session")
def kit_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kit's wheel, built from this checkout (tests/wheel_env.py)."""
    from wheel_env import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, kit_wheel: Path) -> Path:
    """A fresh venv, not the project's, with the wheel and the extras a user installs to train their own
    model and try the Job here (hf, k8s, report); built once per session (about a minute)."""
    from wheel_env import make_venv

    return make_venv(tmp_path_factory.mktemp("wheel-venv") / "venv", kit_wheel)
