"""Helpers for multi-process trainer tests: real processes, real torch.distributed (gloo), 2 ranks.

`run_trainer(...)` starts `python -m torch.distributed.run --nproc-per-node N -m training.train ...`
with a free rendezvous port, OMP_NUM_THREADS=1 and torchelastic's logs under the test's tmp folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--model.name", "tiny",
    "--data.seq_len", "64",
    "--data.batch_size", "2",
    "--optim.warmup_steps", "3",
    "--training.log_every", "1",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> Finished:
        if self.returncode != 0:
            raise AssertionError(
                f"trainer exited {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
            )
        return self


def trainer_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        TMPDIR=str(tmp),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.pop("KIT_HEARTBEAT_DIR", None)
    return env


def run_trainer(
    tmp: Path, args: list[str], *, nproc: int = 2, timeout: float = 240, env: dict[str, str] | None = None
) -> Finished:
    """Run the trainer on `nproc` local ranks under torchrun (no restarts) and wait for it."""
    logs = tmp / "torchelastic"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--max-restarts", "0", "--log-dir", str(logs),
        "-m", "training.train", *args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env=trainer_env(tmp) | (env or {}), capture_output=True, text=True, timeout=timeout
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr)


def run_cli(tmp: Path, args: list[str], *, timeout: float = 120) -> Finished:
    """Run `python -m training.train ARGS` as one plain process (config errors exit before any group)."""
    proc = subprocess.run(
        [sys.executable, "-m", "training.train", *args],
        cwd=REPO,
        env=trainer_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr)


def load_dump(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def tensors(tree: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested dict/list, keyed by its path."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out.update(tensors(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(tensors(v, f"{prefix}/{i}"))
    return out


def assert_bitwise_equal(a: Path, b: Path) -> int:
    """Every tensor of the final model and optimizer of two dumps is bitwise equal; returns the count."""
    da, db = load_dump(a), load_dump(b)
    assert da["step"] == db["step"]
    ta, tb = (
        tensors({"model": da["model"], "optim": da["optim"]}),
        tensors({"model": db["model"], "optim": db["optim"]}),
    )
    assert ta.keys() == tb.keys()
    differ = [k for k in ta if ta[k].dtype != tb[k].dtype or not torch.equal(ta[k], tb[k])]
    assert not differ, f"{len(differ)}/{len(ta)} tensors differ, e.g. {differ[:5]}"
    return len(ta)


REF_STEPS = 12
