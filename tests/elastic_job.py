"""The tiny job that changes its world size in the elastic tests, and its fault-free 4-rank reference.

Shared by tests/training (a restart on other world sizes) and tests/k8s (a node lost with no spare, then
back): both compare what each optimizer step consumed with the same reference run
(fsdpkit.analysis.batch_ledger).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsdpkit.contracts.ports import free_port_run

REPO = Path(__file__).resolve().parents[1]
STEPS = 12
GLOBAL_BATCH = 12
ELASTIC = [
    "--model.name", "tiny",
    "--data.seq_len", "64",
    "--data.batch_size", "1",
    "--training.global_batch", str(GLOBAL_BATCH),
    "--optim.warmup_steps", "3",
    "--training.log_every", "1",
    "--training.steps", str(STEPS),
]  # fmt: skip
"""The tiny job with a global batch of 12 samples per optimizer step: it keeps it exactly on 1, 2, 3, 4, 6
or 12 ranks (gradient accumulation takes up the difference)."""
ELASTIC_LOSS_RTOL = 1e-4
"""How far a resharded run's loss may be from a fixed-size run's, relative: the same mean gradient summed
in another order differs by an fp32 rounding (~1e-7 relative) per reduction; Adam and a dozen steps grow
that by a few orders at most on the tiny model (measured: 6e-8 at 2 -> 1 -> 3 ranks)."""


def run_reference(tmp: Path, nproc: int = 4) -> Path:
    """The ELASTIC job, fault-free, on `nproc` ranks under torchrun, checkpoints off; its run folder."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port_run()}", "--max-restarts", "0",
        "--log-dir", str(tmp / "torchelastic"), "-m", "fsdpkit.trainer",
        "--run.id", "elastic-ref", "--run.root", str(tmp / "runs"), *ELASTIC, "--checkpoint.mode", "off",
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "TMPDIR": str(tmp)}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("KIT_HEARTBEAT_DIR", None)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return tmp / "runs" / "elastic-ref"
