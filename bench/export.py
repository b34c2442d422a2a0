"""Your model back: kit-export-hf's throughput and memory against the size of the checkpoint it reads.

`python -m bench.export [--quick] [--doc FILE]` writes a checkpoint of random values in the shape of the
kit's Llama `small` (125 M parameters) with 2 ranks (real processes, gloo, the kit's own writer and commit
record): FSDP2's row shards, plus one matrix cut along its columns as tensor parallelism would cut it;
optimizer state beside the model (quick: the embedding's first moment; full: AdamW's two moments of every
parameter), so that the export must skip it. Then it exports the step in a child process, float32 and
bfloat16, and measures per export:
- the wall time and the weights' MB written per second (checksum verification of the whole step included);
- peak memory growth: the child's resident high-water mark (VmHWM, reset through /proc/self/clear_refs after
  its imports) minus its resident memory then; against the checkpoint's size on disk;
and, beside them, what torch's own conversion holds: `dcp_to_torch_save` of the same step (one torch.save
file of everything, the first move of a conversion without the kit), measured the same way.

Last line: `RESULT export_mb_s=<float32 weights MB/s> bf16_mb_s=<bfloat16> peak_growth_mb=<largest of the
exports> checkpoint_mb=<the step's files> peak_ratio=<peak growth / checkpoint> dcp_peak_ratio=<torch's>`.
Full mode (3 repetitions, medians) writes docs/benchmarks/export.md; --quick (1) prints, and writes the
section only with --doc.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "export.md"
WORLD = 2
MODEL = "small"
STEP = 100
COLUMN_CUT = "layers.0.feed_forward.w2.weight"
"""The one matrix saved in column blocks (Shard(1)): exported by assembling it whole."""


@dataclass(frozen=True, kw_only=True)
class Scale:
    optim: str
    """Optimizer state saved beside the model: "embedding" (its first moment) or "adamw" (both moments of
    every parameter)."""
    reps: int


QUICK = Scale(optim="embedding", reps=1)
FULL = Scale(optim="adamw", reps=3)


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def values(seed: int, index: int, shape: tuple[int, ...]) -> Any:
    """Tensor `index`'s full value: the same on every rank and in a test that checks the export."""
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(seed * 100_003 + index)) * 0.02


def kit_shapes(model: str) -> list[tuple[str, tuple[int, ...]]]:
    """The kit Llama's parameters of shape `model` (names and shapes, its order), built on meta."""
    import torch

    from fsdpkit.contracts.shapes import MODEL_CONFIGS
    from fsdpkit.trainer.model import Transformer

    with torch.device("meta"):
        return [(n, tuple(p.shape)) for n, p in Transformer(MODEL_CONFIGS[model]).named_parameters()]


def _write_rank(folder: Path, *, model: str, optim: str, seed: int) -> None:
    """One rank's part of the random checkpoint (run under the torch.distributed env); rank 0 commits."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from fsdpkit.resilience.checkpoint.commit import CommitRecord, merge_rank_files, write_commit
    from fsdpkit.resilience.checkpoint.writer import KitStorageWriter

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    weights, state = {}, {}
    for i, (name, shape) in enumerate(kit_shapes(model)):
        cut = [Shard(1 if name == COLUMN_CUT else 0)]
        weights[name] = distribute_tensor(values(seed, i, shape), mesh, cut, src_data_rank=None)
        if optim == "adamw" or (optim == "embedding" and i == 0):
            moments = ("exp_avg", "exp_avg_sq") if optim == "adamw" else ("exp_avg",)
            state[name] = {m: distribute_tensor(values(seed + 1, i, shape), mesh, cut, src_data_rank=None)
                           for m in moments}  # fmt: skip
    tree = {"train": {"model": weights, "optim": {"state": state}, "step": STEP}}
    writer = KitStorageWriter(folder, direct_io=False, rank=rank, world_size=world)
    dcp.save(tree, storage_writer=writer)
    files: list[Any] = [None] * world
    dist.all_gather_object(files, dict(writer.files))
    if rank == 0:
        record = CommitRecord(step=STEP, world_size=world, files=merge_rank_files(files, world))
        write_commit(folder, record)
    dist.barrier()
    dist.destroy_process_group()


def write_random_checkpoint(
    run_dir: Path, *, model: str = MODEL, optim: str = "embedding", seed: int = 0
) -> Path:
    """A committed 2-rank checkpoint of random values at step STEP in `run_dir`; returns its step folder."""
    from fsdpkit.contracts.ports import free_port_run
    from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, step_dir

    folder = step_dir(checkpoints_dir(run_dir), STEP)
    folder.mkdir(parents=True)
    port = str(free_port_run())
    procs = []
    for rank in range(WORLD):
        env = _env() | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
        cmd = [sys.executable, "-m", "bench.export", "--write-rank", str(folder), "--model", model,
               "--optim", optim, "--seed", str(seed)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True))
    errors = [(p.wait(timeout=900), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in errors:
        if code != 0:
            raise RuntimeError(f"a writer rank exited {code}: {err[-2000:]}")
    return folder


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _measure_child(spec: dict[str, Any]) -> None:
    """In the child: imports first, then the baseline, then the work; prints one MEASURE line."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from fsdpkit.export.export import ExportRequest, export_hf

    baseline = _rss("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    t0 = time.perf_counter()
    if spec["kind"] == "dcp_to_torch_save":
        dcp_to_torch_save(spec["folder"], spec["out"])
        summary: dict[str, Any] = {}
    else:
        request = ExportRequest(run=Path(spec["run"]), out=Path(spec["out"]), dtype=spec["dtype"])
        done = export_hf(request)
        summary = {"bytes": done.bytes, "checkpoint_bytes": done.checkpoint_bytes, "verify_s": done.verify_s,
                   "write_s": done.write_s}  # fmt: skip
    wall = time.perf_counter() - t0
    growth = _rss("VmHWM") - baseline
    print("MEASURE " + json.dumps({"wall_s": wall, "peak_growth": growth, "baseline": baseline, **summary}))


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one export (or torch's conversion) in a fresh child process; its MEASURE record."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.export", "--measure", json.dumps(spec)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("MEASURE ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"the measured child exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(line[len("MEASURE ") :])


def _run_once(workdir: Path, run: Path, folder: Path, rep: int) -> dict[str, dict[str, Any]]:
    rows = {}
    for dtype in ("float32", "bfloat16"):
        out = workdir / f"out-{dtype}-{rep}"
        rows[dtype] = measure({"kind": "export", "run": str(run), "out": str(out), "dtype": dtype})
        print(f"rep {rep} {dtype}: {_row_text(rows[dtype])}", flush=True)
        _remove(out)
    target = workdir / f"torch-save-{rep}.pt"
    rows["dcp_to_torch_save"] = measure(
        {"kind": "dcp_to_torch_save", "folder": str(folder), "out": str(target)}
    )
    print(f"rep {rep} dcp_to_torch_save: {_row_text(rows['dcp_to_torch_save'])}", flush=True)
    target.unlink()
    return rows


def _row_text(row: dict[str, Any]) -> str:
    rate = f", {row['bytes'] / 1e6 / row['wall_s']:.0f} MB/s" if "bytes" in row else ""
    return f"{row['wall_s']:.2f} s{rate}, peak growth {row['peak_growth'] / 1e6:.1f} MB"


def _remove(path: Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def run(scale: Scale, workdir: Path) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(RESULT figures, per-kind medians) of `scale.reps` repetitions on one random checkpoint."""
    run_dir = workdir / "run"
    t0 = time.perf_counter()
    folder = write_random_checkpoint(run_dir, optim=scale.optim)
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"checkpoint: {size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s ({folder})", flush=True)
    reps = [_run_once(workdir, run_dir, folder, rep) for rep in range(scale.reps)]
    table: dict[str, dict[str, float]] = {}
    for kind in reps[0]:
        rows = [r[kind] for r in reps]
        table[kind] = {k: _median(rows, k) for k in rows[0] if isinstance(rows[0][k], int | float)}
    fp32, bf16, torch_save = table["float32"], table["bfloat16"], table["dcp_to_torch_save"]
    peak = max(fp32["peak_growth"], bf16["peak_growth"])
    result = {
        "export_mb_s": fp32["bytes"] / 1e6 / fp32["wall_s"],
        "bf16_mb_s": bf16["bytes"] / 1e6 / bf16["wall_s"],
        "peak_growth_mb": peak / 1e6,
        "checkpoint_mb": size / 1e6,
        "peak_ratio": peak / size,
        "dcp_peak_ratio": torch_save["peak_growth"] / size,
    }
    return result, table


def result_line(result: dict[str, float]) -> str:
    fmt = {"peak_ratio": "{:.3f}", "dcp_peak_ratio": "{:.2f}"}
    return "RESULT " + " ".join(f"{k}={fmt.get(k, '{:.1f}').format(v)}" for k, v in result.items())


def write_doc(
    path: Path, result: dict[str, float], table: dict[str, dict[str, float]], *, quick: bool, load: float
) -> None:
    scale = QUICK if quick else FULL
    command = "python -m bench.export" + (f" --quick --doc {path.relative_to(REPO)}" if quick else "")
    optim = (
        "the embedding's first moment"
        if scale.optim == "embedding"
        else "AdamW's two moments of every weight"
    )
    lines = [
        "## Your model back: kit-export-hf throughput and memory (CPU)",
        "",
        f"`{command}`: a committed 2-rank checkpoint of random values in the kit's Llama `{MODEL}` shape "
        f"(125 M parameters, float32; optimizer state: {optim}; one matrix cut along its columns), "
        f"{result['checkpoint_mb']:.0f} MB on disk, exported in a child process; {scale.reps} repetition(s), "
        f"medians; {time.strftime('%Y-%m-%d')}. Peak growth: the child's VmHWM (reset after its imports) "
        "minus its resident memory then. Wall time includes verifying every file's checksum. Load average "
        f"when it started: {load:.1f} on {os.cpu_count()} cores (other work shared the machine: the rates "
        "move with it, the memory does not).",
        "",
        "| conversion | weights written | wall | MB/s | verify | write | peak growth | peak / checkpoint |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "float32": "kit-export-hf --dtype float32",
        "bfloat16": "kit-export-hf --dtype bfloat16",
        "dcp_to_torch_save": "torch's dcp_to_torch_save (all state)",
    }
    for kind, label in labels.items():
        row = table[kind]
        written = f"{row['bytes'] / 1e6:.0f} MB" if "bytes" in row else "-"
        rate = f"{row['bytes'] / 1e6 / row['wall_s']:.0f}" if "bytes" in row else "-"
        phases = (f"{row['verify_s']:.2f} s", f"{row['write_s']:.2f} s") if "bytes" in row else ("-", "-")
        lines.append(
            f"| {label} | {written} | {row['wall_s']:.2f} s | {rate} | {phases[0]} | {phases[1]} | "
            f"{row['peak_growth'] / 1e6:.1f} MB | {row['peak_growth'] / result['checkpoint_mb'] / 1e6:.3f} |"
        )
    lines += ["", result_line(result), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.export", description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="optimizer state of the embedding only, one repetition"
    )
    p.add_argument("--doc", type=Path, help="write the section here (full mode: docs/benchmarks/export.md)")
    p.add_argument("--write-rank", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--model", default=MODEL, help=argparse.SUPPRESS)
    p.add_argument("--optim", default="embedding", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write_rank is not None:
        _write_rank(args.write_rank, model=args.model, optim=args.optim, seed=args.seed)
        return 0
    if args.measure is not None:
        _measure_child(json.loads(args.measure))
        return 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kit-bench-export-") as tmp:
        result, table = run(QUICK if args.quick else FULL, Path(tmp))
    doc = args.doc or (None if args.quick else DOC)
    if doc is not None:
        write_doc(doc.resolve(), result, table, quick=args.quick, load=load)
    print(result_line(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
