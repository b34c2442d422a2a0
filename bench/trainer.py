"""Trainer benchmark: the memory plan against measured peak memory, and what activation checkpointing buys.

`python -m bench.trainer [--quick]` runs the real trainer's session
(`fsdpkit.trainer.train.KitTrainer.build` and
`train_step`: FSDP2, AdamW, gloo) on 2 ranks x 1 thread, once per activation-checkpointing mode, side by side
in one run, and measures per rank:
- peak memory: the kernel's resident high-water mark (VmHWM, reset through /proc/self/clear_refs after a
  warm-up step) minus the resident memory before the model was built (torch itself, the process group);
  glibc hands every tensor of 64 KiB or more to mmap (MALLOC_MMAP_THRESHOLD_), so resident memory follows
  the live tensors and not the allocator's free lists;
- activation memory: the peak minus what was resident right before the measured step's forward;
- step time: the median of the measured steps.
The plan (`fsdpkit.trainer.memory_plan`) is computed for the same shape, world and batch, on_gpu=False.

Last line: `RESULT plan_error=<max over modes of |plan - measured| / measured> ac_memory_ratio=<activation
memory with full AC / without> ac_step_ratio=<step time with full AC / without> selective_memory_ratio=...`.
Full mode writes docs/benchmarks/trainer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fsdpkit.contracts.ports import free_port_run

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "trainer.md"
WORLD = 2
MODES = ("none", "selective", "full")
SHAPE = {True: ("tiny", 1024, 4, 3), False: ("tiny", 1024, 8, 5)}
"""(model, seq_len, micro-batch, measured steps) for quick and full runs."""


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from fsdpkit import resilience
    from fsdpkit.runtime.distributed import init_distributed, shutdown
    from fsdpkit.trainer.config import load_config
    from fsdpkit.trainer.train import KitTrainer

    run_root = args.run_root
    cfg = load_config(
        [
            "--run.id", f"ac-{args.mode}", "--run.root", run_root, "--model.name", args.model,
            "--model.activation_checkpointing", args.mode, "--data.seq_len", str(args.seq_len),
            "--data.batch_size", str(args.batch), "--checkpoint.mode", "off",
        ]
    )  # fmt: skip
    ctx = init_distributed(timeout_s=300)
    base = _rss("VmRSS")
    job, trainer = resilience.Job(cfg), KitTrainer(cfg)
    job.ctx = ctx
    session = trainer.build(job)
    trainer.train_step(job, session)  # optimizer state exists
    torch.distributed.barrier()
    before = _rss("VmRSS")
    _reset_peak()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        trainer.train_step(job, session)
        times.append(time.perf_counter() - t0)
    peak = _rss("VmHWM")
    job.close()
    out = {
        "rank": ctx.rank,
        "peak": peak - base,
        "activation": peak - before,
        "step_s": statistics.median(times),
    }
    Path(args.out).write_text(json.dumps(out))
    shutdown()


def measure(
    mode: str, *, model: str, seq_len: int, batch: int, steps: int, workdir: Path
) -> dict[str, float]:
    """One run of `mode` on WORLD ranks; the worst rank's memory and the slower rank's step time."""
    port = free_port_run()
    procs, outs = [], []
    for rank in range(WORLD):
        out = workdir / f"{mode}-{rank}.json"
        outs.append(out)
        env = os.environ | {
            "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": "65536",
        }  # fmt: skip
        cmd = [
            sys.executable, "-m", "bench.trainer", "--worker", "--mode", mode, "--model", model,
            "--seq-len", str(seq_len), "--batch", str(batch), "--steps", str(steps),
            "--run-root", str(workdir / "runs"), "--out", str(out),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"error: the {mode} run failed (exit codes {codes})")
    ranks = [json.loads(o.read_text()) for o in outs]
    return {
        "peak": max(r["peak"] for r in ranks),
        "activation": max(r["activation"] for r in ranks),
        "step_s": max(r["step_s"] for r in ranks),
    }


def planned(mode: str, *, model: str, seq_len: int, batch: int) -> int:
    from fsdpkit.contracts.shapes import MODEL_CONFIGS
    from fsdpkit.trainer.memory_plan import plan

    shape = MODEL_CONFIGS[model]
    p = plan(
        shape, world_size=WORLD, ranks_per_node=WORLD, seq_len=seq_len, micro_batch=batch, ac=mode,
        device_capacity=1 << 40, host_capacity=1 << 40, on_gpu=False,
    )  # fmt: skip
    return p.device_total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer tokens and steps (about a minute)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--mode", "--model", "--run-root", "--out"):
        p.add_argument(name, help=argparse.SUPPRESS)
    for name in ("--seq-len", "--batch", "--steps"):
        p.add_argument(name, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    model, seq_len, batch, steps = SHAPE[args.quick]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="kit-bench-trainer-") as tmp:
        for mode in MODES:
            got = measure(mode, model=model, seq_len=seq_len, batch=batch, steps=steps, workdir=Path(tmp))
            got["plan"] = planned(mode, model=model, seq_len=seq_len, batch=batch)
            got["error"] = abs(got["plan"] - got["peak"]) / got["peak"]
            rows[mode] = got
            print(
                f"{mode:>9}: measured peak {got['peak'] / 2**20:7.1f} MiB, "
                f"plan {got['plan'] / 2**20:7.1f} MiB "
                f"(error {got['error']:.3f}), activations {got['activation'] / 2**20:7.1f} MiB, "
                f"step {got['step_s']:.3f} s",
                flush=True,
            )
    result = {
        "plan_error": max(r["error"] for r in rows.values()),
        "ac_memory_ratio": rows["full"]["activation"] / rows["none"]["activation"],
        "ac_step_ratio": rows["full"]["step_s"] / rows["none"]["step_s"],
        "selective_memory_ratio": rows["selective"]["activation"] / rows["none"]["activation"],
    }
    if not args.quick:
        _write_doc(rows, result, model=model, seq_len=seq_len, batch=batch, steps=steps)
    print("RESULT " + " ".join(f"{k}={v:.4f}" for k, v in result.items()))
    return 0


def _write_doc(rows, result, *, model: str, seq_len: int, batch: int, steps: int) -> None:
    lines = [
        "## Trainer: memory plan and activation checkpointing (CPU)",
        "",
        f"`python -m bench.trainer`: model {model}, {WORLD} ranks x 1 thread (gloo), seq_len {seq_len}, "
        f"micro-batch {batch}, {steps} measured steps after one warm-up step, {time.strftime('%Y-%m-%d')}.",
        "",
        "| activation checkpointing | measured peak MiB | plan MiB | plan error | activation MiB | step s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, r in rows.items():
        lines.append(
            f"| {mode} | {r['peak'] / 2**20:.1f} | {r['plan'] / 2**20:.1f} | {r['error']:.3f} | "
            f"{r['activation'] / 2**20:.1f} | {r['step_s']:.3f} |"
        )
    lines += [
        "",
        "Memory is the kernel's resident high-water mark less the memory before the model was built; it does "
        "not depend on load. Step times do: read ac_step_ratio as indicative on a busy machine.",
        "",
        "RESULT " + " ".join(f"{k}={v:.4f}" for k, v in result.items()),
        "",
    ]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
