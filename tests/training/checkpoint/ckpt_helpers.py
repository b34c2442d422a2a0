"""Launch the checkpoint test worker as real processes, one per rank, with the torch.distributed env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsdpkit.contracts.ports import free_port_run

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).resolve().parent / "ckpt_worker.py"


def start(
    run_dir: Path, *args: str, world: int = 2, env: dict[str, str] | None = None
) -> list[subprocess.Popen]:
    port = free_port_run()
    procs = []
    for rank in range(world):
        penv = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            # a worker that aborts (SIGABRT from C++) prints every Python thread's stack: where it was
            "PYTHONFAULTHANDLER": "1",
            **(env or {}),
        }
        cmd = [sys.executable, str(WORKER), "--run-dir", str(run_dir), *args]
        procs.append(
            subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((p.returncode, stdout, stderr))
    return out


def run(
    run_dir: Path, *args: str, world: int = 2, env: dict[str, str] | None = None
) -> list[tuple[int, str, str]]:
    results = finish(start(run_dir, *args, world=world, env=env))
    for rc, _, stderr in results:
        if rc != 0:
            raise AssertionError(f"worker failed with {rc}:\n{stderr[-3000:]}")
    return results
