"""A small FSDP2 training loop that drives the Checkpointer, for the checkpoint tests (one process per rank).

Run with the usual torch.distributed env (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Batches are a pure
function of (step, rank), so a resumed run must end bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from fsdpkit.resilience.checkpoint.checkpointer import Checkpointer
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.resume import CheckpointError
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.process_exit import leave

WIDTH = 64


class App(Stateful):
    """Model, optimizer, step and RNG: what a resume must restore."""

    def __init__(self, seed: int, mesh: object | None) -> None:
        torch.manual_seed(seed)
        layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(3)]
        self.model = torch.nn.Sequential(*layers)
        if mesh is not None:
            for layer in layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.step = 0

    def state_dict(self) -> dict:
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd, "step": self.step, "rng": torch.get_rng_state()}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.step = sd["step"]
        torch.set_rng_state(sd["rng"])

    def train_step(self, step: int, rank: int) -> None:
        g = torch.Generator().manual_seed(1_000_003 * step + rank)
        x = torch.randn(8, WIDTH, generator=g)
        noise = torch.randn(8, WIDTH)  # uses the global RNG, so RNG restore matters
        loss = (self.model(x) - 0.01 * noise).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.step = step


def local_tensors(app: App) -> dict[str, torch.Tensor]:
    """Every tensor of the state, local shard only, cloned: path -> tensor."""
    out: dict[str, torch.Tensor] = {}

    def walk(obj: object, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.to_local() if isinstance(obj, DTensor) else obj
            out[path] = t.detach().clone()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}/{i}")

    walk(app.state_dict(), "")
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--mode", default="async")
    p.add_argument("--backend", default="kit")
    p.add_argument("--interval", type=int, default=2)
    p.add_argument("--keep", type=int, default=10)
    p.add_argument("--resume", action="store_true")
    p.add_argument(
        "--verify-snapshots", action="store_true", help="compare each committed step with the live state"
    )
    p.add_argument(
        "--fsize-limit", type=int, default=0, help="RLIMIT_FSIZE in bytes: writes beyond fail (EFBIG)"
    )
    p.add_argument("--tiers", default="off", help="checkpoint.tiers (needs --tier-root)")
    p.add_argument(
        "--tier-root", default="", help="each rank is a node: its memory tier is <root>/node<rank>"
    )
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if a.fsize_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (a.fsize_limit, a.fsize_limit))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    mesh = None
    if world > 1:
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (world,))
    run_dir = Path(a.run_dir)
    events = EventLog(run_dir, role="trainer", rank=rank)
    if a.tier_root:
        os.environ["KIT_TIER_DIR"] = str(Path(a.tier_root) / f"node{rank}")
        os.environ["LOCAL_WORLD_SIZE"] = "1"
    cfg = CheckpointConfig(mode=a.mode, backend=a.backend, interval=a.interval, keep=a.keep, tiers=a.tiers)
    ckpt = Checkpointer(cfg, run_dir=run_dir, rank=rank, world_size=world, events=events)
    app = App(seed=0, mesh=mesh)
    try:
        start = ckpt.load({"app": app}) if a.resume else None
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 78
    print(f"rank {rank} resumed_from {start}", flush=True)
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    step = start or 0
    while step < a.steps:
        step += 1
        app.train_step(step, rank)
        if a.verify_snapshots and step % a.interval == 0:
            snapshots[step] = local_tensors(app)
        ckpt.maybe_save(step, {"app": app})
    ckpt.close()
    print(f"rank {rank} finished step {step}", flush=True)
    if not a.fsize_limit:
        torch.save(local_tensors(app), run_dir / f"final_rank{rank}.pt")
    if a.verify_snapshots:
        report = {}
        for s, snap in snapshots.items():
            folder = run_dir / "checkpoints" / f"step_{s:08d}"
            if not (folder / "commit.json").exists():
                continue
            fresh = App(seed=123, mesh=mesh)
            dcp.load({"app": fresh}, checkpoint_id=folder)
            got = local_tensors(fresh)
            report[s] = sorted(k for k in snap if not torch.equal(snap[k], got[k]))
        (run_dir / f"snapshots_rank{rank}.json").write_text(json.dumps(report))
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # As the trainer (training/trainer/train.py): leave without the interpreter's teardown of torch's C++
    # state, where this worker aborted twice ('terminate called without an active exception', then a segfault
    # while faulthandler dumped the threads: once in 57 runs on 2026-12-02 night, once in a make test later)
    leave(main())
