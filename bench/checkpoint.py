"""Checkpoint benchmark: the training-time cost of each way to save, side by side in one run.

`python -m bench.checkpoint [--quick]` starts 2 ranks (gloo, FSDP2, 1 thread each), which train the same
model on the same data once per competitor and repetition:
  none          no checkpoint (the baseline wall time)
  sync          torch `dcp.save` (stock FileSystemWriter)
  dcp_thread    torch `dcp.async_save`, thread mode, default stager (blocking copy per save)
  dcp_staging   torch `dcp.async_save` with a reused DefaultStager and async staging (wait on staging before
                the next optimizer step)
  kit           the kit's Checkpointer, mode async, backend kit, writer_priority idle
  nvrx          NVRx TorchAsyncCheckpoint, where it can run (needs CUDA); otherwise "not available: why"
The interval is calibrated so that sync's efficiency is about 60 % (interval x step time = 1.5 x sync save),
but at least MIN_INTERVAL (2) steps, so that the step after an overlapped one runs alone and gives the run
its own base step time (below). Each save gets a full interval to overlap; the final drain is timed apart.

Repetitions: every competitor runs once per repetition, in an order rotated by one each repetition (so a
drift of the machine, or a position in the sequence, hits all of them alike). Every figure is computed per
repetition and reported as its median with the spread (min-max) over the repetitions.

Per competitor: stall per save (loop blocked), slow-down of the steps that overlap a background write, peak
host memory growth per rank / checkpoint size per rank, efficiency as the study defines it
(1 - stalls / wall, drain excluded), and two costs measured inside each competitor's own run (not as a
difference of two runs, whose noise was the size of the kit's whole cost):
  save CPU per save (both ranks): the main thread's CPU (`time.thread_time()`) inside the save calls, the
      waits outside the steps and the drain, plus the CPU of every thread born during the run (the kit's
      writer and its group's gloo threads, built inside the run; DCP's executor and stager threads: the
      process's CPU delta less the deltas of the threads alive at the start, each read from the kernel's
      per-thread CPU clock), plus the deltas of the shared checkpoint group's gloo threads (they run the
      DCP saves' collectives). `none` is charged only with that group's idle socket loop (~0.01 s per rank
      and run, steady); that, per step, is taken off every competitor. Blocking waits cost no CPU; what
      overlapping costs the training steps is in the wall figure, not here.
  extra wall (paired): stalls outside the steps + sum over the overlapped steps of (step - base) + drain,
      per rank, mean of the ranks. The base is the median of the run's own non-overlapped steps (its
      first left out) when it has at least 3, else the median step of `none` in the same repetition (a
      run whose writes outlast a step). Measured on 2026-12-02 under load: with `none`'s median as every
      run's base (interval 1, the calibrated value here) the kit's paired extra wall came out -9..+7 s
      over the repetitions of a full run, as other load moves step times between runs; with its own base
      (interval 2, the quick size) 0.8-1.7 s. The cost: twice the steps per run.
Cross-check columns, each a difference of two runs (noisier, kept to check the paired figures against): extra
wall over the `none` run (drain included) and extra process CPU per save over the `none` run. Last line,
medians over the repetitions:
`RESULT stall_ratio=... efficiency=... cost_ratio=... vs_dcp_async=... mem_ratio=... cpu_ratio=...`
(kit vs sync stall, kit's efficiency, kit vs sync paired extra wall, kit vs the better dcp.async_save's
paired extra wall, kit memory, kit's save CPU per save vs the cheaper dcp.async_save's); the line before
it, `SPREAD`, holds each figure's min-max. `--json PATH` records the figures; `--check-stability A.json
B.json C.json` says whether runs agree within 10 % on every RESULT figure (bench/stability.py: a figure that
moves more than that between idle runs cannot back a claim).
glibc's dynamic mmap threshold is pinned (MALLOC_MMAP_THRESHOLD_) so freed buffers return to the OS and
each competitor's peak memory is its own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import stability
from bench.checkpoint_competitors import COMPETITORS, SaveSetup, start, train_and_save, train_state
from bench.checkpoint_measure import Measured, RssSampler, ThreadCpu, Window, settle_threads, thread_cpu_ns
from fsdpkit.contracts.ports import free_port_run

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Size:
    width: int
    layers: int
    batch: int
    saves: int
    """Per competitor and repetition."""
    reps: int
    """Repetitions of the whole set of competitors."""


QUICK = Size(width=1536, layers=6, batch=16, saves=3, reps=3)
FULL = Size(width=2048, layers=8, batch=16, saves=6, reps=5)
MIN_INTERVAL = 2
"""Steps between saves at least: with 1 every step after a save overlaps it and no run has steps of its
own to take its base step time from (see the module docstring)."""
RESULT_KEYS = ("stall_ratio", "efficiency", "cost_ratio", "vs_dcp_async", "mem_ratio", "cpu_ratio")


# ------------------------------------------------------------------------------------------- worker
@dataclass(frozen=True, kw_only=True)
class _Rank:
    """This rank's share of the run: its FSDP2 model and optimizer, its data, and the gloo group the saves
    use apart from training's."""

    size: Size
    rank: int
    world: int
    model: Any
    opt: Any
    ckpt_pg: Any
    ckpt_pg_threads: set[int]
    """The checkpoint group's gloo threads: they run the DCP saves' collectives, so their CPU is the
    saves'."""

    def step(self, i: int) -> float:
        """One training step on batch `i` (seeded by step and rank), in seconds."""
        import torch

        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(1_000_003 * i + self.rank)
        x = torch.randn(self.size.batch, self.size.width, generator=g)
        self.model(x).pow(2).mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        return time.perf_counter() - t0

    def state(self) -> dict[str, Any]:
        return train_state(self.model, self.opt)


def _start_rank(size: Size) -> _Rank:
    """Joins the gloo job (RANK, WORLD_SIZE from the parent) and builds the model every competitor trains."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    before_pg = set(thread_cpu_ns())
    ckpt_pg = dist.new_group(backend="gloo")
    ckpt_pg_threads = set(thread_cpu_ns()) - before_pg
    torch.manual_seed(0)
    layers = [torch.nn.Linear(size.width, size.width) for _ in range(size.layers)]
    model = torch.nn.Sequential(*layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _Rank(
        size=size,
        rank=rank,
        world=world,
        model=model,
        opt=opt,
        ckpt_pg=ckpt_pg,
        ckpt_pg_threads=ckpt_pg_threads,
    )


def _local_bytes(r: _Rank) -> int:
    """Bytes of this rank's shard of the model and optimizer state: its checkpoint size."""
    import torch
    from torch.distributed.tensor import DTensor

    ckpt_bytes = 0
    for v in list(r.state()["model"].values()) + [
        t for s in r.state()["optim"]["state"].values() for t in s.values()
    ]:
        if isinstance(v, torch.Tensor):
            ckpt_bytes += (v.to_local() if isinstance(v, DTensor) else v).nbytes
    return ckpt_bytes


@dataclass(frozen=True)
class _Calibration:
    sync_s: float
    """One dcp.save after the warm-up."""
    step_s: float
    """Median training step."""
    interval: int
    """Steps between saves, the largest any rank asked for (see MIN_INTERVAL)."""


def _calibrate(r: _Rank, work: Path) -> _Calibration:
    """Times a sync save and a step so that sync's efficiency comes out about 60 %."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    # Warm-up first: the first DCP call of a process costs seconds extra.
    dcp.save(r.state(), checkpoint_id=work / "warm", process_group=r.ckpt_pg)
    t0 = time.perf_counter()
    dcp.save(r.state(), checkpoint_id=work / "calib", process_group=r.ckpt_pg)
    sync_s = time.perf_counter() - t0
    step_s = statistics.median(r.step(i) for i in range(3, 7))
    want = torch.tensor([max(MIN_INTERVAL, round(1.5 * sync_s / step_s))])
    dist.all_reduce(want, op=dist.ReduceOp.MAX)
    return _Calibration(sync_s=sync_s, step_s=step_s, interval=int(want.item()))


def _measure(
    name: str,
    r: _Rank,
    setup: SaveSetup,
    *,
    folder: Path,
    steps: int,
    interval: int,
    baseline_threads: set[int],
) -> Measured:
    """One competitor's run on this rank: the timed loop, then the drain, with its CPU and peak memory."""
    import gc

    import torch.distributed as dist

    m = Measured(name=name)
    window = Window()
    settle_threads(baseline_threads)
    dist.barrier()
    gc.collect()
    threads = ThreadCpu(r.ckpt_pg_threads)  # before the competitor: the threads it starts are the saves'
    comp = start(name, setup, folder)
    sampler = RssSampler()
    threads.exclude(sampler.native_id)
    dist.barrier()
    cpu0 = time.process_time()
    t_start = time.perf_counter()
    train_and_save(comp, m, step=r.step, steps=steps, interval=interval, step_seed=100, window=window)
    m.wall_s = time.perf_counter() - t_start
    m.loop_stall_s = window.wall_s
    t0 = time.perf_counter()
    with window:
        comp.drain()
    m.drain_s = time.perf_counter() - t0
    m.cpu_s = time.process_time() - cpu0
    born_cpu, m.born_threads, m.lost_threads = threads.stop()
    m.main_save_cpu_s = window.cpu_s
    m.save_cpu_s = born_cpu + window.cpu_s
    m.peak_rss_growth = sampler.stop()
    comp.finish(m)
    dist.barrier()
    if r.rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return m


def _worker(args: argparse.Namespace) -> None:
    """One rank: calibrate, then every competitor once per repetition in an order rotated by one each time;
    the figures go to OUT/rank<N>.json for the parent."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.staging import StagingOptions

    from fsdpkit.resilience.checkpoint.config import CheckpointConfig, nvrx_unavailable_reason

    size = QUICK if args.quick else FULL
    r = _start_rank(size)
    work = Path(args.dir)
    for i in range(1, 3):
        r.step(i)  # AdamW state exists from here on
    ckpt_bytes = _local_bytes(r)
    cal = _calibrate(r, work)
    total_steps = (size.saves + 1) * cal.interval
    baseline_threads = set(thread_cpu_ns())
    setup = SaveSetup(
        model=r.model,
        opt=r.opt,
        ckpt_pg=r.ckpt_pg,
        rank=r.rank,
        world_size=r.world,
        # the writer in the idle class: this bench's node does nothing but train (docs/checkpointing.md)
        kit=CheckpointConfig(
            mode="async", backend="kit", interval=cal.interval, keep=2, writer_priority="idle"
        ),
        kit_app_key="app_model",
        staging=StagingOptions(False, False, True, False),
    )
    reason = nvrx_unavailable_reason() or "needs a GPU run (bench/gpu/checkpoint_gpu.py)"
    runnable = [n for n in COMPETITORS if n != "nvrx"]
    results = []
    for rep in range(size.reps):
        shift = rep % len(runnable)
        for name in runnable[shift:] + runnable[:shift]:
            m = _measure(
                name,
                r,
                setup,
                folder=work / name,
                steps=total_steps,
                interval=cal.interval,
                baseline_threads=baseline_threads,
            )
            m.rep = rep
            results.append(m)
        results.append(Measured(name="nvrx", rep=rep, available=False, reason=reason))
    out = {
        "rank": r.rank,
        "interval": cal.interval,
        "steps": total_steps,
        "reps": size.reps,
        "ckpt_bytes": ckpt_bytes,
        "calib_sync_s": cal.sync_s,
        "calib_step_s": cal.step_s,
        "results": [asdict(m) for m in results],
    }
    (Path(args.out) / f"rank{r.rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------- parent
MIN_OWN_BASE_STEPS = 3
"""A run's own non-overlapped steps (its first step left out) give its base step time when there are at
least this many; otherwise the base is `none`'s median step, same rank and repetition."""


def _paired_extra_wall(m: dict[str, Any], none: dict[str, Any]) -> tuple[float, bool]:
    """One rank's run: (seconds its saves added to the loop, whether its own steps gave the base).

    Stalls outside the steps + what the overlapped steps took over the base step time + the drain. The
    base is the median (robust to one odd step) of the run's own non-overlapped steps, or `none`'s."""
    own = [s for s, o in zip(m["step_s"][1:], m["overlapped"][1:], strict=True) if not o]
    use_own = len(own) >= MIN_OWN_BASE_STEPS
    base = statistics.median(own if use_own else none["step_s"][1:])
    over = sum(s - base for s, o in zip(m["step_s"], m["overlapped"], strict=True) if o)
    return m["loop_stall_s"] + over + m["drain_s"], use_own


def _summarize(ranks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One repetition, per competitor: worst rank for stalls and memory, mean for walls, sum for CPU."""
    ckpt_bytes = max(r["ckpt_bytes"] for r in ranks)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        for m in r["results"]:
            by_name.setdefault(m["name"], []).append(m)
    none = by_name["none"]  # one per rank, in rank order like every other competitor's
    base_wall = statistics.mean(m["wall_s"] + m["drain_s"] for m in none)
    base_step = statistics.median(s for m in none for s in m["step_s"][1:])
    base_mem = max(m["peak_rss_growth"] for m in none)  # training's own transient buffers
    base_cpu = sum(m["cpu_s"] for m in none)
    # The idle checkpoint group's own threads (gloo's socket loop: ~0.01 s per rank and run here), the
    # only thing `none` is charged with; per step, as the same steps run in every competitor.
    idle_cpu_per_step = sum(m["save_cpu_s"] / len(m["step_s"]) for m in none)
    saves_per_run = max(len(m["stalls_s"]) for ms in by_name.values() for m in ms)
    rows = []
    for name in COMPETITORS:
        ms = by_name[name]
        if not ms[0]["available"]:
            rows.append({"name": name, "available": False, "reason": ms[0]["reason"]})
            continue
        stalls = (
            [max(vals) for vals in zip(*(m["stalls_s"] for m in ms), strict=True)]
            if ms[0]["stalls_s"]
            else []
        )
        per_save = max(1, len(stalls) if name != "none" else saves_per_run)
        wall = statistics.mean(m["wall_s"] for m in ms)
        drain = statistics.mean(m["drain_s"] for m in ms)
        over = [s for m in ms for s, o in zip(m["step_s"], m["overlapped"], strict=True) if o]
        paired = [_paired_extra_wall(m, n) for m, n in zip(ms, none, strict=True)]
        rows.append(
            {
                "name": name,
                "available": True,
                "saves": len(stalls),
                "stall_per_save_s": statistics.mean(stalls) if stalls else 0.0,
                "overlap_slowdown": (statistics.mean(over) / base_step - 1) if over else 0.0,
                "mem_ratio": max(m["peak_rss_growth"] - base_mem for m in ms) / ckpt_bytes,
                "efficiency": 1 - sum(stalls) / wall,
                "wall_s": wall,
                "drain_s": drain,
                "extra_wall_s": statistics.mean(e for e, _ in paired),
                "own_base": sum(own for _, own in paired) / len(paired),
                "extra_wall_vs_none_s": wall + drain - base_wall,
                "staging_ratio": max(m["staging_bytes"] for m in ms) / ckpt_bytes,
                "save_cpu_per_save_s": (
                    sum(m["save_cpu_s"] for m in ms)
                    - (idle_cpu_per_step * len(ms[0]["step_s"]) if stalls else 0)
                )
                / per_save,
                "main_cpu_per_save_s": sum(m["main_save_cpu_s"] for m in ms) / per_save,
                "extra_cpu_vs_none_per_save_s": (sum(m["cpu_s"] for m in ms) - base_cpu) / per_save,
            }
        )
    get = {r["name"]: r for r in rows}
    sync_extra = get["sync"]["extra_wall_s"]
    for r in rows:
        if r["available"]:
            r["cost_ratio"] = r["extra_wall_s"] / sync_extra if sync_extra > 0 else float("nan")
    kit = get["kit"]
    dcp_rows = [get[n] for n in ("dcp_thread", "dcp_staging") if get[n]["available"]]
    best_dcp = min((r["extra_wall_s"] for r in dcp_rows), default=float("inf"))
    best_dcp_cpu = min((r["save_cpu_per_save_s"] for r in dcp_rows), default=float("inf"))
    result = {
        "stall_ratio": kit["stall_per_save_s"] / get["sync"]["stall_per_save_s"],
        "efficiency": kit["efficiency"],
        "cost_ratio": kit["cost_ratio"],
        "vs_dcp_async": kit["extra_wall_s"] / best_dcp if best_dcp > 0 else float("inf"),
        "mem_ratio": kit["mem_ratio"],
        "cpu_ratio": kit["save_cpu_per_save_s"] / best_dcp_cpu if best_dcp_cpu > 0 else float("inf"),
    }
    return rows, result


def _summarize_reps(ranks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """`_summarize` per repetition; every figure becomes its median, with `<figure>_min` / `_max` in the
    rows, and each RESULT figure is [median, min, max] over the repetitions."""
    reps = sorted({m.get("rep", 0) for r in ranks for m in r["results"]})
    per_rep = [
        _summarize([{**r, "results": [m for m in r["results"] if m.get("rep", 0) == k]} for r in ranks])
        for k in reps
    ]
    rows = []
    for i, row in enumerate(per_rep[0][0]):
        merged = dict(row)
        for key, value in row.items():
            if isinstance(value, float):
                merged[key], merged[f"{key}_min"], merged[f"{key}_max"] = _spread(
                    [rep_rows[i][key] for rep_rows, _ in per_rep]
                )
        rows.append(merged)
    result = {key: list(_spread([res[key] for _, res in per_rep])) for key in RESULT_KEYS}
    return rows, result


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the finite values (a ratio over a zero or negative difference, which only a
    heavily loaded machine produces, is left out); all nan if none is finite."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    return statistics.median(finite), min(finite), max(finite)


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    """`median (min-max)` where the row has a spread, else the value."""
    text = format(row[key], fmt)
    if f"{key}_min" in row:
        text += f" ({format(row[f'{key}_min'], fmt)}-{format(row[f'{key}_max'], fmt)})"
    return text


def _table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"2 ranks, checkpoint {meta['ckpt_mb']:.0f} MB per rank, step {meta['step_s']:.3f} s, "
        f"sync save {meta['sync_s']:.2f} s, interval {meta['interval']} steps, "
        f"{meta['steps']} steps per competitor and repetition, {meta.get('reps', 1)} repetition(s)"
        + (" (median (min-max) over them)" if meta.get("reps", 1) > 1 else ""),
        "",
        "| competitor | stall/save s | overlapped-step slow-down | mem / ckpt (above none) | efficiency | "
        "extra wall s (paired) | cost vs sync | drain s | save CPU s per save (both ranks) | "
        "cross-check: extra wall s vs none run | cross-check: extra process CPU s per save vs none run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["available"]:
            lines.append(f"| {r['name']} | not available: {r['reason']} | | | | | | | | | |")
            continue
        cells = [
            _cell(r, "stall_per_save_s", ".3f"),
            _cell(r, "overlap_slowdown", "+.0%"),
            _cell(r, "mem_ratio", ".2f"),
            _cell(r, "efficiency", ".4f"),
            _cell(r, "extra_wall_s", ".2f"),
            _cell(r, "cost_ratio", ".2f"),
            _cell(r, "drain_s", ".2f"),
            _cell(r, "save_cpu_per_save_s", ".3f"),
            _cell(r, "extra_wall_vs_none_s", ".2f"),
            _cell(r, "extra_cpu_vs_none_per_save_s", ".2f"),
        ]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_stability(paths: list[str]) -> int:
    """`--check-stability A.json B.json C.json`: one line per RESULT figure, exit 0 if all agree."""
    return stability.check_stability(paths, RESULT_KEYS, bench="bench.checkpoint")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smaller model, {QUICK.saves} saves x {QUICK.reps} repetitions (under 3 minutes, 2 idle cores)",
    )
    p.add_argument("--dir", default=None, help="folder for the checkpoints (default: a temporary folder)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument(
        "--check-stability",
        nargs="+",
        metavar="JSON",
        help="compare the RESULT medians of runs saved with --json (agree within 10 %%?) and exit",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    if args.check_stability is not None:
        return check_stability(args.check_stability)
    if args.dir is not None and not Path(args.dir).parent.is_dir():
        print(
            f"error: --dir {args.dir}: parent folder does not exist; create it or pick another",
            file=sys.stderr,
        )
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    out = work / "results"
    out.mkdir()
    port = free_port_run()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": "131072",
            "PYTHONPATH": str(REPO),
        }
        cmd = [sys.executable, "-m", "bench.checkpoint", "--worker", "--dir", str(work), "--out", str(out)]
        cmd += ["--quick"] if args.quick else []
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO))
    codes = [proc.wait() for proc in procs]
    try:
        if any(codes):
            print(f"error: benchmark ranks exited with {codes}", file=sys.stderr)
            return 1
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows, result = _summarize_reps(ranks)
    meta = {
        "ckpt_mb": ranks[0]["ckpt_bytes"] / 1e6,
        "step_s": ranks[0]["calib_step_s"],
        "sync_s": ranks[0]["calib_sync_s"],
        "interval": ranks[0]["interval"],
        "steps": ranks[0]["steps"],
        "reps": ranks[0]["reps"],
    }
    print(_table(rows, meta))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "result": result}, indent=1))
    print("SPREAD " + " ".join(f"{k}={lo:.4f}-{hi:.4f}" for k, (_, lo, hi) in result.items()))
    print("RESULT " + " ".join(f"{k}={med:.4f}" for k, (med, _, _) in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
