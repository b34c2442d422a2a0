"""Helpers for multi-process trainer tests: real processes, real torch.distributed (gloo), 2 ranks.

`run_trainer(...)` starts `python -m torch.distributed.run --nproc-per-node N -m fsdpkit.trainer ...`
with a free rendezvous port, OMP_NUM_THREADS=1 and torchelastic's logs under the test's tmp folder;
`launch_trainer(...)` runs it under the kit's launcher instead. Fault-equivalence tests end with
`assert_same_final_checkpoint` (the persisted final checkpoint, loaded back from disk, equals the
fault-free run's, value by value) and `assert_resumes_from_final` (the same job started again resumes
from it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.resilience.checkpoint.compare import Comparison, compare_checkpoints, final_checkpoint
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--model.name", "tiny",
    "--data.seq_len", "64",
    "--data.batch_size", "2",
    "--optim.warmup_steps", "3",
    "--training.log_every", "1",
]  # fmt: skip


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
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port_run()}",
        "--max-restarts", "0", "--log-dir", str(logs),
        "-m", "fsdpkit.trainer", *args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env=trainer_env(tmp) | (env or {}), capture_output=True, text=True, timeout=timeout
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr)


def run_cli(
    tmp: Path, args: list[str], *, timeout: float = 120, env: dict[str, str] | None = None
) -> Finished:
    """Run `python -m fsdpkit.trainer ARGS` as one plain process (config errors exit before any group)."""
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.trainer", *args],
        cwd=REPO,
        env=trainer_env(tmp) | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr)


FINAL_GROUPS = {"model", "optim", "scheduler", "data", "step", "rng.rank0", "rng.rank1"}
"""What a 2-rank final checkpoint holds and every comparison must cover."""


def assert_same_final_checkpoint(run_dir: Path, reference: Path, *, step: int | None = None) -> Comparison:
    """The newest committed checkpoint of `run_dir`, verified and loaded back from disk, equals the
    reference run's value by value (every tensor bitwise; scheduler, data position, step, RNG)."""
    mine, ref = final_checkpoint(run_dir), final_checkpoint(reference)
    step = REF_STEPS if step is None else step
    assert mine.name == ref.name == f"step_{step:08d}", (mine, ref)
    result = compare_checkpoints(mine, ref)
    assert result.equal, result.summary()
    assert result.groups >= FINAL_GROUPS, f"not compared: {FINAL_GROUPS - result.groups}"
    return result


def assert_resumes_from_final(tmp: Path, trainer_args: list[str], run_dir: Path, *, step: int | None = None):
    """Starting the same job again (no faults) resumes from the final checkpoint, from disk, verified."""
    step = REF_STEPS if step is None else step
    before = len(read_events(run_dir))
    run_trainer(tmp, trainer_args).check()
    resumes = [e for e in read_events(run_dir)[before:] if e["kind"] == "resume"]
    assert {(e["rank"], e["step"], e["source"]) for e in resumes} == {
        (0, step, "shared"),
        (1, step, "shared"),
    }


def launch_trainer(
    tmp: Path, name: str, launcher: list[str], trainer: list[str], *, env: dict[str, str] | None = None
) -> tuple[Path, list[str]]:
    """Run REF_STEPS steps of the tiny job under the kit launcher (2 ranks); (run folder, trainer args)."""
    root = tmp / "runs"
    run_dir = root / name
    args = ["--run.id", name, "--run.root", str(root), *TINY, "--training.steps", str(REF_STEPS), *trainer]
    cmd = [
        sys.executable, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node", "2",
        "--log-dir", str(tmp / "logs"), "--run-dir", str(run_dir), *launcher, "-m", "fsdpkit.trainer", *args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env={**trainer_env(tmp), **(env or {})}, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == exitcodes.OK, proc.stderr[-4000:]
    return run_dir, args


REF_STEPS = 12
