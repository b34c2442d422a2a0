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
Cross-check columns, the old definitions: extra wall over the `none` run (drain included) and extra
process CPU per save over the `none` run. Last line, medians over the repetitions:
`RESULT stall_ratio=... efficiency=... cost_ratio=... vs_dcp_async=... mem_ratio=... cpu_ratio=...`
(kit vs sync stall, kit's efficiency, kit vs sync paired extra wall, kit vs the better dcp.async_save's
paired extra wall, kit memory, kit's save CPU per save vs the cheaper dcp.async_save's); the line before
it, `SPREAD`, holds each figure's min-max. `--json PATH` records the figures; `--check-stability A.json
B.json C.json` says whether runs agree within 10 % on every RESULT figure (issue 15's test of a benchmark
that holds still).
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
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import stability
from training.contracts.ports import free_port_run

REPO = Path(__file__).resolve().parents[1]
COMPETITORS = ("none", "sync", "dcp_thread", "dcp_staging", "kit", "nvrx")


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
@dataclass
class Measured:
    name: str
    rep: int = 0
    """Repetition this run belongs to."""
    available: bool = True
    reason: str = ""
    wall_s: float = 0.0
    """Training loop, first step to last step, final drain excluded."""
    drain_s: float = 0.0
    stalls_s: list[float] = field(default_factory=list)
    """Per save: time the loop was blocked by it."""
    step_s: list[float] = field(default_factory=list)
    overlapped: list[bool] = field(default_factory=list)
    """Per step: a background write of this rank was in flight when the step began."""
    peak_rss_growth: int = 0
    staging_bytes: int = 0
    cpu_s: float = 0.0
    """CPU seconds of the whole process (all threads) over loop + drain (the cross-check figure)."""
    save_cpu_s: float = 0.0
    """CPU seconds of the saves themselves, measured directly: the main thread inside the save calls,
    the waits outside the steps and the drain, plus every thread born during the run, plus the checkpoint
    group's own gloo threads (see `ThreadCpu`)."""
    main_save_cpu_s: float = 0.0
    """The main thread's part of save_cpu_s."""
    loop_stall_s: float = 0.0
    """Wall seconds the loop spent in save calls and in waits outside the steps (drain excluded); unlike
    stalls_s it leaves out the kit's optimizer-hook wait, which a step's own time already holds."""
    born_threads: int = 0
    lost_threads: int = 0
    """Threads alive at the run's start that were gone by its end (their CPU after the start would count
    as the save's; each run first waits, bounded, for the previous run's threads to end)."""


class RssSampler:
    """Peak resident memory of this process above a baseline, sampled every 20 ms on a thread."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._stop = threading.Event()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.native_id = self._thread.native_id

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(0, self.peak - self.base)


def _thread_cpu_ns() -> dict[int, int]:
    """On-CPU nanoseconds of every live thread of this process (threads listed in `/proc/self/task`),
    each read from the kernel's per-thread CPU clock, the clock `time.process_time()` sums. Unlike the
    first field of `/proc/self/task/<tid>/schedstat`, that clock includes a running thread's current slice
    (schedstat lags by up to a scheduler tick per running thread: ~10 ms per run here). A thread that ends
    while being read is left out."""
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        try:  # Linux's clock id of thread `tid` (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED))
            out[tid] = time.clock_gettime_ns((~tid << 3) | 6)
        except OSError:
            continue
    return out


class ThreadCpu:
    """CPU of the threads born between `__init__` and `stop()`, and of the listed `also` threads.

    Born threads (the kit's writer and its group's gloo threads, DCP's executor and stager threads) may end
    before `stop()`, so their CPU is what is left of the process's CPU delta once every thread that was
    alive at the start has its own delta taken out. A thread alive at the start and gone at the end cannot
    be read any more: it is counted in `lost`."""

    def __init__(self, also: set[int]) -> None:
        self._also = also
        self._exclude: set[int] = set()
        self._before = _thread_cpu_ns()
        self._cpu0 = time.process_time()

    def exclude(self, tid: int | None) -> None:
        """A thread born after the start that is not the save's (the memory sampler): left out."""
        if tid is not None:
            self._exclude.add(tid)

    def stop(self) -> tuple[float, int, int]:
        """(CPU seconds of born + `also` threads, born threads alive now, pre-existing threads lost)."""
        cpu = time.process_time() - self._cpu0
        after = _thread_cpu_ns()
        kept = [t for t in self._before if t in after]
        pre = sum(after[t] - self._before[t] for t in kept) / 1e9
        also = sum(after[t] - self._before[t] for t in kept if t in self._also) / 1e9
        left_out = sum(after.get(t, 0) for t in self._exclude if t not in self._before) / 1e9
        born = sum(1 for t in after if t not in self._before and t not in self._exclude)
        return max(0.0, cpu - pre - left_out) + also, born, len(self._before) - len(kept)


class Window:
    """Accumulates the wall and this thread's CPU time spent inside `with window:` blocks."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def __enter__(self) -> Window:
        self._t0, self._c0 = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s += time.perf_counter() - self._t0
        self.cpu_s += time.thread_time() - self._c0


def _settle_threads(baseline: set[int], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until the threads a previous run started have ended, so that none of them ends
    during the next run's measurement (its CPU could not be told apart). One still there after the
    timeout stays for good: it joins `baseline`, so later runs do not wait for it again."""
    deadline = time.monotonic() + timeout_s
    while extra := set(_thread_cpu_ns()) - baseline:
        if time.monotonic() >= deadline:
            baseline |= extra
            return
        time.sleep(0.01)


def _worker(args: argparse.Namespace) -> None:
    import gc

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from training.resilience.checkpoint.checkpointer import Checkpointer
    from training.resilience.checkpoint.config import CheckpointConfig, nvrx_unavailable_reason
    from training.runtime.events import EventLog, read_events

    size = QUICK if args.quick else FULL
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    before_pg = set(_thread_cpu_ns())
    ckpt_pg = dist.new_group(backend="gloo")
    ckpt_pg_threads = set(_thread_cpu_ns()) - before_pg  # its gloo workers run the saves' collectives
    torch.manual_seed(0)
    layers = [torch.nn.Linear(size.width, size.width) for _ in range(size.layers)]
    model = torch.nn.Sequential(*layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    work = Path(args.dir)

    def step(i: int) -> float:
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(1_000_003 * i + rank)
        x = torch.randn(size.batch, size.width, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    def state() -> dict[str, Any]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd}

    for i in range(1, 3):
        step(i)  # AdamW state exists from here on
    ckpt_bytes = 0
    for v in list(state()["model"].values()) + [
        t for s in state()["optim"]["state"].values() for t in s.values()
    ]:
        if isinstance(v, torch.Tensor):
            ckpt_bytes += (v.to_local() if isinstance(v, DTensor) else v).nbytes

    # Warm-up (the first DCP call of a process costs seconds extra), then calibrate the interval.
    dcp.save(state(), checkpoint_id=work / "warm", process_group=ckpt_pg)
    t0 = time.perf_counter()
    dcp.save(state(), checkpoint_id=work / "calib", process_group=ckpt_pg)
    sync_s = time.perf_counter() - t0
    step_s = statistics.median(step(i) for i in range(3, 7))
    want = torch.tensor([max(MIN_INTERVAL, round(1.5 * sync_s / step_s))])
    dist.all_reduce(want, op=dist.ReduceOp.MAX)
    interval = int(want.item())
    total_steps = (size.saves + 1) * interval
    baseline_threads = set(_thread_cpu_ns())

    def run(name: str) -> Measured:
        m = Measured(name=name)
        folder = work / name
        pending: dict[str, Any] = {"fut": None, "staging": None}
        ckpt = None
        stager = None
        window = Window()
        _settle_threads(baseline_threads)
        dist.barrier()
        gc.collect()
        threads = ThreadCpu(ckpt_pg_threads)  # before the Checkpointer: its threads are the saves'
        if name == "kit":
            events = EventLog(folder, role="trainer", rank=rank)
            # the writer in the idle class: this bench's node does nothing but train (docs/checkpointing.md)
            cfg = CheckpointConfig(
                mode="async", backend="kit", interval=interval, keep=2, writer_priority="idle"
            )
            ckpt = Checkpointer(cfg, run_dir=folder, rank=rank, world_size=world, events=events)
        if name == "dcp_staging":
            stager = DefaultStager(StagingOptions(False, False, True, False))

        def in_flight() -> bool:
            if ckpt is not None:
                save = ckpt._inflight
                return save is not None and not save.done.is_set()
            fut = pending["fut"]
            return fut is not None and not fut.done()

        def wait_previous() -> None:
            if pending["fut"] is not None:
                pending["fut"].result()
                pending["fut"] = None

        sampler = RssSampler()
        threads.exclude(sampler.native_id)
        dist.barrier()
        cpu0 = time.process_time()
        t_start = time.perf_counter()
        for i in range(1, total_steps + 1):
            m.overlapped.append(in_flight())
            if pending["staging"] is not None:  # dcp_staging: the copy must finish before opt.step
                t0 = time.perf_counter()
                with window:
                    pending["staging"].result()
                pending["staging"] = None
                m.stalls_s[-1] += time.perf_counter() - t0
            m.step_s.append(step(100 + i))
            if i % interval or i == total_steps or name == "none":
                continue
            t0 = time.perf_counter()
            path = folder / f"step_{i:08d}"
            with window:
                if name == "kit":
                    ckpt.maybe_save(i, {"app_model": model_state(model, opt)})
                elif name == "sync":
                    dcp.save(state(), checkpoint_id=path, process_group=ckpt_pg)
                elif name == "dcp_thread":
                    wait_previous()
                    pending["fut"] = dcp.async_save(state(), checkpoint_id=path, process_group=ckpt_pg)
                elif name == "dcp_staging":
                    wait_previous()
                    resp = dcp.async_save(
                        state(), checkpoint_id=path, process_group=ckpt_pg, async_stager=stager
                    )
                    pending["fut"], pending["staging"] = resp.upload_completion, resp.staging_completion
            m.stalls_s.append(time.perf_counter() - t0)
        m.wall_s = time.perf_counter() - t_start
        m.loop_stall_s = window.wall_s
        t0 = time.perf_counter()
        with window:
            if ckpt is not None:
                ckpt.wait()
            wait_previous()
        m.drain_s = time.perf_counter() - t0
        m.cpu_s = time.process_time() - cpu0
        born_cpu, m.born_threads, m.lost_threads = threads.stop()
        m.main_save_cpu_s = window.cpu_s
        m.save_cpu_s = born_cpu + window.cpu_s
        m.peak_rss_growth = sampler.stop()
        if ckpt is not None:
            m.staging_bytes = ckpt._stager.nbytes if ckpt._stager else 0
            ckpt.close()
            # The kit's stalls are its own events (maybe_save plus any optimizer-hook wait for the copy).
            mine = [e for e in read_events(folder) if e["kind"] == "ckpt" and e["phase"] == "stall"]
            per_step: dict[int, float] = {}
            for e in mine:
                if e["rank"] == rank:
                    per_step[e["step"]] = per_step.get(e["step"], 0.0) + e["duration_s"]
            m.stalls_s = [per_step[s] for s in sorted(per_step)]
        if stager is not None:
            stager.close()
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        return m

    reason = nvrx_unavailable_reason() or "needs a GPU run (bench/gpu/checkpoint_gpu.py)"
    runnable = [n for n in COMPETITORS if n != "nvrx"]
    results = []
    for rep in range(size.reps):
        shift = rep % len(runnable)
        for name in runnable[shift:] + runnable[:shift]:
            m = run(name)
            m.rep = rep
            results.append(m)
        results.append(Measured(name="nvrx", rep=rep, available=False, reason=reason))
    out = {
        "rank": rank,
        "interval": interval,
        "steps": total_steps,
        "reps": size.reps,
        "ckpt_bytes": ckpt_bytes,
        "calib_sync_s": sync_s,
        "calib_step_s": step_s,
        "results": [asdict(r) for r in results],
    }
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def model_state(model: Any, opt: Any) -> Any:
    """The model and optimizer as one Stateful (what a trainer's TrainState would hand over)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class _State(Stateful):
        def state_dict(self) -> dict[str, Any]:
            msd, osd = get_state_dict(model, opt)
            return {"model": msd, "optim": osd}

        def load_state_dict(self, sd: dict[str, Any]) -> None:
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

    return _State()


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
