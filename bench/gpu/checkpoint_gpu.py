"""Checkpoint benchmark on one CUDA GPU (an H200): stall and cost of each way to save, side by side.

`python -m bench.gpu.checkpoint_gpu [--ckpt-gb 2] [--out DIR]` (results go to DIR, default $BENCH_OUT or
bench/gpu/results: checkpoint_gpu.json and checkpoint_gpu.md; the last line printed is RESULT ...).

Same competitors and figures as `bench.checkpoint` (none, sync dcp.save, dcp.async_save default stager,
dcp.async_save with pinned async staging, the kit's async Checkpointer with pinned host staging, NVRx
TorchAsyncCheckpoint where installed), one process, FSDP2 over a 1-GPU mesh, NCCL for training and a gloo
group for checkpoints. Model size: the largest that fits GPU memory (16 B/param with AdamW), host memory
(one pinned staging copy plus DCP's), the disk (two checkpoints) and `--ckpt-gb` (the time budget: a sync
save writes at ~0.3 GB/s through torch's zip CRC). Goals: kit stall < 1 s, cost_ratio < 0.05.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.checkpoint import _summarize, _table
from bench.checkpoint_competitors import COMPETITORS, SaveSetup, start, train_and_save, train_state
from bench.checkpoint_measure import Measured, RssSampler

WIDTH = 4096


def _layers_that_fit(ckpt_gb: float, work: Path) -> int:
    import psutil
    import torch

    per_layer = WIDTH * WIDTH + WIDTH  # params
    gpu = torch.cuda.get_device_properties(0).total_memory * 0.7 / (16 * per_layer)
    host = psutil.virtual_memory().available * 0.35 / (12 * per_layer)
    disk = shutil.disk_usage(work).free * 0.4 / (12 * per_layer)
    budget = ckpt_gb * 1e9 / (12 * per_layer)
    return max(1, int(min(gpu, host, disk, budget)))


@dataclass(frozen=True, kw_only=True)
class _Gpu:
    """The model every competitor trains: FSDP2 over a 1-GPU mesh, NCCL for training, gloo for the saves."""

    model: Any
    opt: Any
    ckpt_pg: Any
    batch: int
    layers: int

    def step(self, i: int) -> float:
        """One training step on batch `i`, in seconds, the GPU synchronised at its end."""
        import torch

        t0 = time.perf_counter()
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(self.batch, WIDTH, device="cuda", generator=g)
        self.model(x).float().pow(2).mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def state(self) -> dict[str, Any]:
        return train_state(self.model, self.opt)


def _join() -> tuple[Any, Any]:
    """A one-process job on a free local port: (the 1-GPU mesh, the gloo group for the saves)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("cpu:gloo,cuda:nccl")
    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (1,))
    return mesh, dist.new_group(backend="gloo")


def _build_model(args: argparse.Namespace, work: Path, mesh: Any, ckpt_pg: Any) -> _Gpu:
    """The largest model that fits (`_layers_that_fit`), sharded with FSDP2."""
    import torch
    from torch.distributed.fsdp import fully_shard

    n_layers = _layers_that_fit(args.ckpt_gb, work)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, WIDTH, device="cuda") for _ in range(n_layers)]
    model = torch.nn.Sequential(*layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return _Gpu(model=model, opt=opt, ckpt_pg=ckpt_pg, batch=args.batch, layers=n_layers)


def _calibrate(gpu: _Gpu, work: Path) -> tuple[float, float]:
    """(one sync dcp.save after a warm-up, the median step), in seconds; both checkpoints removed."""
    import torch.distributed.checkpoint as dcp

    dcp.save(gpu.state(), checkpoint_id=work / "warm", process_group=gpu.ckpt_pg)
    shutil.rmtree(work / "warm")
    t0 = time.perf_counter()
    dcp.save(gpu.state(), checkpoint_id=work / "calib", process_group=gpu.ckpt_pg)
    sync_s = time.perf_counter() - t0
    shutil.rmtree(work / "calib")
    return sync_s, statistics.median(gpu.step(i) for i in range(3, 13))


def _measure(name: str, gpu: _Gpu, setup: SaveSetup, folder: Path, *, steps: int, interval: int) -> Measured:
    """One competitor's run: the timed loop, then the drain, with the peak host memory."""
    m = Measured(name=name)
    comp = start(name, setup, folder)
    sampler = RssSampler()
    t_start = time.perf_counter()
    train_and_save(
        comp, m, step=gpu.step, steps=steps, interval=interval, step_seed=1000, window=nullcontext()
    )
    m.wall_s = time.perf_counter() - t_start
    t0 = time.perf_counter()
    comp.drain()
    m.drain_s = time.perf_counter() - t0
    m.peak_rss_growth = sampler.stop()
    comp.finish(m)
    shutil.rmtree(folder, ignore_errors=True)
    return m


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate, then every competitor once; one that cannot run is reported with its reason."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.staging import StagingOptions

    from fsdpkit.resilience.checkpoint.config import CheckpointConfig, nvrx_unavailable_reason

    mesh, ckpt_pg = _join()
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-gpu-", dir=args.dir))
    gpu = _build_model(args, work, mesh, ckpt_pg)
    for i in range(3):
        gpu.step(i)
    ckpt_bytes = 12 * sum(p.numel() for p in gpu.model.parameters())
    sync_s, step_s = _calibrate(gpu, work)
    interval = max(1, round(1.5 * sync_s / step_s))
    total = (args.saves + 1) * interval
    setup = SaveSetup(
        model=gpu.model,
        opt=gpu.opt,
        ckpt_pg=ckpt_pg,
        rank=0,
        world_size=1,
        kit=CheckpointConfig(mode="async", backend="kit", interval=interval, keep=2),
        kit_app_key="app",
        staging=StagingOptions(True, False, True, True),
        keep_sync_saves=False,
    )
    results = []
    for name in COMPETITORS:
        if name == "nvrx" and (reason := nvrx_unavailable_reason()):
            results.append(Measured(name=name, available=False, reason=reason))
            continue
        try:
            results.append(_measure(name, gpu, setup, work / name, steps=total, interval=interval))
        except Exception as exc:  # report a competitor that cannot run, keep the others
            results.append(Measured(name=name, available=False, reason=" ".join(str(exc).split())[:200]))
    shutil.rmtree(work, ignore_errors=True)
    dist.destroy_process_group()
    return {
        "rank": 0,
        "interval": interval,
        "steps": total,
        "ckpt_bytes": ckpt_bytes,
        "calib_sync_s": sync_s,
        "calib_step_s": step_s,
        "layers": gpu.layers,
        "gpu": torch.cuda.get_device_name(0),
        "results": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.checkpoint_gpu", description=__doc__.splitlines()[0]
    )
    p.add_argument("--ckpt-gb", type=float, default=2.0, help="upper bound of the checkpoint size in GB")
    p.add_argument("--saves", type=int, default=2, help="saves per competitor")
    p.add_argument("--batch", type=int, default=8192, help="tokens per step")
    p.add_argument("--dir", default=None, help="folder for the checkpoints (default: a temporary folder)")
    p.add_argument("--out", default=os.environ.get("BENCH_OUT", "bench/gpu/results"), help="results folder")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device visible to torch; run this on a GPU machine", file=sys.stderr)
        return 2
    if args.ckpt_gb <= 0 or args.saves < 1:
        print("error: --ckpt-gb must be > 0 and --saves >= 1", file=sys.stderr)
        return 2
    data = _run(args)
    rows, result = _summarize([data])
    meta = {
        "ckpt_mb": data["ckpt_bytes"] / 1e6,
        "step_s": data["calib_step_s"],
        "sync_s": data["calib_sync_s"],
        "interval": data["interval"],
        "steps": data["steps"],
    }
    table = _table(rows, meta).replace("2 ranks", f"1 GPU ({data['gpu']}), {data['layers']} layers")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_gpu.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "result": result}, indent=1)
    )
    (out / "checkpoint_gpu.md").write_text(table + "\n")
    print(table)
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
