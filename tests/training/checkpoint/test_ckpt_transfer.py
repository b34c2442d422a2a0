"""The buddy exchange with real processes (3 ranks, each its own "node", gloo): every rank ends holding its
ring neighbour's copy; and when a rank's process dies while its peers wait in the exchange (its node lost
mid-save), its peers fail at once with the closed connection, not at the group's timeout, and leave no
partial copy behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_helpers import REPO

from fsdpkit.contracts.ports import free_port_run

pytestmark = pytest.mark.slow
WORKER = Path(__file__).resolve().parent / "transfer_worker.py"
WORLD = 3
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
PG_TIMEOUT_S = 300
"""Far longer than the test's own limit: a rank that waited for it would fail the test by hanging."""


def _run(tier_root: Path, *args: str) -> dict[int, dict]:
    port = free_port_run()
    argv = [sys.executable, str(WORKER), "--tier-root", str(tier_root), "--pg-timeout-s", str(PG_TIMEOUT_S)]
    base = {"WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [
        subprocess.Popen(
            [*argv, *args],
            env={**ENV, **base, "RANK": str(rank), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    out = {}
    for rank, proc in enumerate(procs):
        stdout, stderr = proc.communicate(timeout=120)
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if lines:
            out[rank] = json.loads(lines[-1])
        assert proc.returncode == 0, stderr[-2000:]
    return out


def test_each_rank_ends_holding_its_ring_neighbours_copy(shm_dir: Path) -> None:
    got = _run(shm_dir)
    assert {r: (o.get("held_for"), o.get("origin")) for r, o in got.items()} == {
        0: (2, "peer"), 1: (0, "peer"), 2: (1, "peer")
    }  # fmt: skip
    assert all(o["held"] == sorted({r, (r - 1) % WORLD}) and o["pending"] == [] for r, o in got.items())


def test_a_peer_that_dies_during_the_exchange_fails_it_at_once_and_leaves_no_partial_copy(
    shm_dir: Path,
) -> None:
    got = _run(shm_dir, "--die-before", "2")
    assert sorted(got) == [0, 1]  # rank 2 printed nothing: it died
    for rank, outcome in got.items():
        error = outcome.get("error", "")
        assert "Connection closed by peer" in error or "Connection reset" in error, (rank, outcome)
        assert "Timed out" not in error
        assert outcome["held"] == [rank] and outcome["pending"] == []  # only its own copy
