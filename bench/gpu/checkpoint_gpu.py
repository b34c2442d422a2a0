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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.checkpoint import COMPETITORS, Measured, RssSampler, _summarize, _table, model_state

WIDTH = 4096


def _local_flat(obj: Any, path: str = "") -> dict[str, Any]:
    """Model and optimizer state as one flat dict of local tensors (what torch.save per rank holds)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_local_flat(v, f"{path}/{k}"))
        return out
    return {path: obj.to_local() if hasattr(obj, "to_local") else obj}


def _layers_that_fit(ckpt_gb: float, work: Path) -> int:
    import psutil
    import torch

    per_layer = WIDTH * WIDTH + WIDTH  # params
    gpu = torch.cuda.get_device_properties(0).total_memory * 0.7 / (16 * per_layer)
    host = psutil.virtual_memory().available * 0.35 / (12 * per_layer)
    disk = shutil.disk_usage(work).free * 0.4 / (12 * per_layer)
    budget = ckpt_gb * 1e9 / (12 * per_layer)
    return max(1, int(min(gpu, host, disk, budget)))


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from training.resilience.checkpoint.checkpointer import Checkpointer
    from training.resilience.checkpoint.config import CheckpointConfig, nvrx_unavailable_reason
    from training.runtime.events import EventLog, read_events

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("cpu:gloo,cuda:nccl")
    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (1,))
    ckpt_pg = dist.new_group(backend="gloo")
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-gpu-", dir=args.dir))
    n_layers = _layers_that_fit(args.ckpt_gb, work)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, WIDTH, device="cuda") for _ in range(n_layers)]
    model = torch.nn.Sequential(*layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(i: int) -> float:
        t0 = time.perf_counter()
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(args.batch, WIDTH, device="cuda", generator=g)
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def state() -> dict[str, Any]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd}

    for i in range(3):
        step(i)
    ckpt_bytes = 12 * sum(p.numel() for p in model.parameters())
    dcp.save(state(), checkpoint_id=work / "warm", process_group=ckpt_pg)
    shutil.rmtree(work / "warm")
    t0 = time.perf_counter()
    dcp.save(state(), checkpoint_id=work / "calib", process_group=ckpt_pg)
    sync_s = time.perf_counter() - t0
    shutil.rmtree(work / "calib")
    step_s = statistics.median(step(i) for i in range(3, 13))
    interval = max(1, round(1.5 * sync_s / step_s))
    total = (args.saves + 1) * interval
    cuda_opts = StagingOptions(True, False, True, True)

    def run(name: str) -> Measured:
        m = Measured(name=name)
        folder = work / name
        ckpt = stager = nvrx = None
        pend: dict[str, Any] = {"fut": None, "staging": None}
        if name == "kit":
            cfg = CheckpointConfig(mode="async", backend="kit", interval=interval, keep=2)
            ckpt = Checkpointer(
                cfg, run_dir=folder, rank=0, world_size=1, events=EventLog(folder, role="trainer", rank=0)
            )
        elif name == "dcp_staging":
            stager = DefaultStager(cuda_opts)
        elif name == "nvrx":
            from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint

            nvrx = TorchAsyncCheckpoint(persistent_queue=True)
            folder.mkdir(parents=True)

        def wait_previous() -> None:
            if pend["fut"] is not None:
                pend["fut"].result()
                pend["fut"] = None
            if nvrx is not None:
                nvrx.finalize_async_save(blocking=True, no_dist=True)

        sampler = RssSampler()
        t_start = time.perf_counter()
        for i in range(1, total + 1):
            if ckpt is not None:
                m.overlapped.append(ckpt._inflight is not None and not ckpt._inflight.done.is_set())
            else:
                m.overlapped.append(pend["fut"] is not None and not pend["fut"].done())
            if pend["staging"] is not None:
                t0 = time.perf_counter()
                pend["staging"].result()
                pend["staging"] = None
                m.stalls_s[-1] += time.perf_counter() - t0
            m.step_s.append(step(1000 + i))
            if i % interval or i == total or name == "none":
                continue
            t0 = time.perf_counter()
            path = folder / f"step_{i:08d}"
            if name == "kit":
                ckpt.maybe_save(i, {"app": model_state(model, opt)})
            elif name == "sync":
                dcp.save(state(), checkpoint_id=path, process_group=ckpt_pg)
                shutil.rmtree(path)
            elif name == "dcp_thread":
                wait_previous()
                pend["fut"] = dcp.async_save(state(), checkpoint_id=path, process_group=ckpt_pg)
            elif name == "dcp_staging":
                wait_previous()
                r = dcp.async_save(state(), checkpoint_id=path, process_group=ckpt_pg, async_stager=stager)
                pend["fut"], pend["staging"] = r.upload_completion, r.staging_completion
            elif name == "nvrx":
                wait_previous()
                nvrx.async_save(_local_flat(state()), str(path) + ".pt")
            m.stalls_s.append(time.perf_counter() - t0)
        m.wall_s = time.perf_counter() - t_start
        t0 = time.perf_counter()
        if ckpt is not None:
            ckpt.wait()
        wait_previous()
        m.drain_s = time.perf_counter() - t0
        m.peak_rss_growth = sampler.stop()
        if ckpt is not None:
            m.staging_bytes = ckpt._stager.nbytes
            ckpt.close()
            per: dict[int, float] = {}
            for e in read_events(folder):
                if e["kind"] == "ckpt" and e["phase"] == "stall":
                    per[e["step"]] = per.get(e["step"], 0.0) + e["duration_s"]
            m.stalls_s = [per[s] for s in sorted(per)]
        if stager is not None:
            stager.close()
        if nvrx is not None:
            nvrx.close()
        shutil.rmtree(folder, ignore_errors=True)
        return m

    results = []
    for name in COMPETITORS:
        if name == "nvrx" and (reason := nvrx_unavailable_reason()):
            results.append(Measured(name=name, available=False, reason=reason))
            continue
        try:
            results.append(run(name))
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
        "layers": n_layers,
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
