"""bench/gpu cannot rot on machines without a GPU: its trainer check runs end to end on CPU (--dry-run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_trainer_gpu_dry_run_measures_every_mode(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu.trainer_gpu", "--dry-run", "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "trainer_gpu.json").read_text())
    assert set(result["rows"]) == {"none", "selective", "full"}
    for row in result["rows"].values():
        assert row["layers"] >= 1 and row["tokens_per_s"] > 0 and row["mfu"] is None
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT tokens_per_s_none=")


def test_run_all_refuses_without_a_gpu(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "bench/gpu/run_all.sh"), str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
