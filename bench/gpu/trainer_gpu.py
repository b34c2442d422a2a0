"""Trainer on one CUDA GPU: step time, tokens/s, MFU and peak memory against the memory plan, per AC mode.

`python -m bench.gpu.trainer_gpu [--out DIR] [--dry-run]`. For each activation-checkpointing mode (none,
selective, full) it picks the largest Llama shape that fits this GPU by `fsdpkit.trainer.memory_plan`
(Llama-3.1-8B widths, vocabulary and 8K context; layers from 1 up to 32), builds it with the trainer's own
`build_model` (FSDP2 over a 1-GPU mesh, bf16 mixed precision, AdamW), runs warm-up plus measured steps and
records: step time, tokens/s, MFU (fsdpkit.contracts.throughput: FLOPs per token / the device's peak), the
allocator's peak (torch.cuda.max_memory_allocated) and the plan's estimate of it (the plan's total less its
runtime reserve). Results: DIR/trainer_gpu.json and .md (DIR defaults to $BENCH_OUT, else bench/gpu/results).
Last line:
`RESULT plan_error_<mode>=... mfu_<mode>=... tokens_per_s_<mode>=...`.

`--dry-run` runs the same code on CPU with a tiny shape (gloo, one step per mode), so `make test` keeps
it from rotting on machines without a GPU. Needs no network: everything is in the tree or in torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

LLAMA_LAYERS = 32
MODES = ("none", "selective", "full")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def largest_shape(mode: str, *, capacity: int, seq_len: int, on_gpu: bool, base) -> tuple[object, object]:
    """(ModelArgs, plan) with the most layers of `base`'s widths that fit `capacity` by the plan."""
    from fsdpkit.trainer.memory_plan import plan

    best = None
    for layers in range(1, base.n_layers + 1):
        args = dataclasses.replace(base, n_layers=layers, max_seq_len=max(base.max_seq_len, seq_len))
        p = plan(
            args, world_size=1, ranks_per_node=1, seq_len=seq_len, micro_batch=1, ac=mode,
            device_capacity=capacity, host_capacity=1 << 50, on_gpu=on_gpu, staging=False,
        )  # fmt: skip
        if not p.fits:
            break
        best = (args, p)
    return best if best else (None, None)


def run_mode(mode: str, args, *, seq_len: int, steps: int, device, mesh) -> dict[str, float]:
    import torch

    from fsdpkit.contracts.throughput import flops_per_token, peak_flops
    from fsdpkit.trainer.model import build_model, loss_fn

    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build_model(
        args, mesh=mesh, device=device, seed=0, param_dtype=torch.bfloat16 if on_gpu else None,
        activation_checkpointing=mode,
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(0)
    times = []
    for i in range(steps + 1):  # the first step allocates AdamW's state and warms the kernels
        tokens = torch.randint(0, args.vocab_size, (1, seq_len + 1), generator=gen).to(device)
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_gpu:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    flops = flops_per_token(
        params=args.num_params(), vocab_size=args.vocab_size, dim=args.dim, n_layers=args.n_layers,
        seq_len=seq_len,
    )  # fmt: skip
    peak = peak_flops(torch.cuda.get_device_name(device)) if on_gpu else None
    rate = seq_len / step_s
    out = {
        "layers": args.n_layers,
        "params_b": args.num_params() / 1e9,
        "step_s": step_s,
        "tokens_per_s": rate,
        "mfu": rate * flops / peak if peak else None,
        "peak_allocated": torch.cuda.max_memory_allocated(device) if on_gpu else None,
    }
    del model, opt
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.trainer_gpu", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT", "bench/gpu/results")))
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, one step per mode")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import torch

    from fsdpkit.contracts.shapes import MODEL_CONFIGS, ModelArgs
    from fsdpkit.runtime.distributed import init_distributed, shutdown
    from fsdpkit.trainer.memory_plan import GIB

    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device visible to torch; use --dry-run on a CPU machine", file=sys.stderr)
        return 2
    ctx = init_distributed(timeout_s=600)
    on_gpu = ctx.device.type == "cuda"
    if args.dry_run:
        base = ModelArgs(
            vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=64
        )
        seq_len, steps, capacity = 64, 1, 1 * GIB
    else:
        base = MODEL_CONFIGS["llama3.1-8b"]
        seq_len, steps = base.max_seq_len, args.steps
        capacity = torch.cuda.get_device_properties(ctx.device).total_memory
    rows: dict[str, dict] = {}
    for mode in MODES:
        shape, plan = largest_shape(mode, capacity=capacity, seq_len=seq_len, on_gpu=on_gpu, base=base)
        if shape is None:
            rows[mode] = {"error": "not even one layer fits by the plan"}
            continue
        got = run_mode(mode, shape, seq_len=seq_len, steps=steps, device=ctx.device, mesh=ctx.mesh)
        got["plan_allocated"] = plan.device_total - plan.reserve
        if got["peak_allocated"]:
            got["plan_error"] = abs(got["plan_allocated"] - got["peak_allocated"]) / got["peak_allocated"]
        rows[mode] = got
        print(f"{mode}: {json.dumps(got)}", flush=True)
    shutdown()
    name = torch.cuda.get_device_name(ctx.device) if on_gpu else "cpu (dry run)"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trainer_gpu.json").write_text(json.dumps({"device": name, "seq_len": seq_len, "rows": rows}))
    lines = [
        f"## Trainer on one GPU ({name}, seq_len {seq_len}, micro-batch 1, {steps} measured steps)",
        "",
        "| AC | layers | params (B) | step s | tokens/s | MFU | peak allocated GiB | plan GiB | plan error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    result = {}
    for mode, r in rows.items():
        if "error" in r:
            lines.append(f"| {mode} | {r['error']} |||||||| ")
            continue
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        alloc = "-" if r["peak_allocated"] is None else f"{r['peak_allocated'] / GIB:.1f}"
        err = r.get("plan_error")
        lines.append(
            f"| {mode} | {r['layers']} | {r['params_b']:.2f} | {r['step_s']:.3f} | "
            f"{r['tokens_per_s']:,.0f} | "
            f"{mfu} | {alloc} | {r['plan_allocated'] / GIB:.1f} | {'-' if err is None else f'{err:.3f}'} |"
        )
        result[f"tokens_per_s_{mode}"] = r["tokens_per_s"]
        if r["mfu"] is not None:
            result[f"mfu_{mode}"] = r["mfu"]
        if err is not None:
            result[f"plan_error_{mode}"] = err
    (args.out / "trainer_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
