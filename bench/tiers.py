"""Memory tiers against shared storage: the same faults restored from memory and from a peer, and from
shared storage alone, side by side in one run.

`python -m bench.tiers [--quick] [--reps N]` runs the kit's trainer through the rendered local Job (`python -m
k8s local`): MODEL=small (~750 MB of state per rank: fp32 weights and two AdamW moments), 2 pods x 1 rank and
one hot spare, async checkpoints every CHECKPOINT_INTERVAL steps. Each case runs with CHECKPOINT_TIERS=peer
and with CHECKPOINT_TIERS=off, interleaved (a slow minute of the machine hits both):
  kill    rank 1 SIGKILLed (a worker lost, its node healthy): tiers restore every rank from its own memory
  node    pod 1's node lost (every process SIGKILLed), the spare takes over: the survivor restores from its
          own memory, the spare gets pod 1's state from its buddy (pod 0)
  steady  no fault, saves every STEADY_INTERVAL steps: what the tiers (the copy in memory and the one
          sent to the buddy) cost the loop, once warm: measured after the first WARMUP_SAVES saves, which
          allocate the tiers' memory once per job (each rank's copy and its buddy's, for the kept step and
          the one being written); every later save writes over the files of the step it replaces

Shared storage is made as slow as it is on EKS. On this machine a "shared" read comes from the page cache at
memory speed; every read from the shared checkpoint folder is paced (`checkpoint.shared_read_mib_s`) at one
rank's share of the deployed FSx for Lustre: its aggregate throughput (cdk.json: storage GiB x MB/s per TiB)
divided over the ranks that restore at once (every GPU of the GPU node group's max_nodes p5 nodes, 8 each).
A rank's own shard, verified before it is loaded, is then read from the page cache (shared_reads.py).

Figures, from each run's events (fsdpkit.analysis.metrics): a fault's restore time (the slowest rank's
`resume`), the bytes read from the shared checkpoint folder during restores, the loop's checkpoint stall (the
kit's `stall_s`: seconds the loop was blocked by saves) and its period (seconds per step over whole save
intervals, stalls and contention included), and the tiers' own work per save (`tier` events).
RESULT restore_ratio=<tier restore s / shared restore s, summed over the kill and node cases>
shared_reads_on_restore=<bytes the tiered restores read from shared storage> tier_stall_ratio=<steady
checkpoint stall with tiers / without> tier_period_ratio=<steady loop period with tiers / without>; goals
<= 0.2, 0, <= 1.05 (the period has no goal of its own: on this machine's 2 cores the tiers' copies take CPU
and memory bandwidth from training that a p5 host has idle; docs/checkpointing.md, "Memory tiers"). Full
mode also writes docs/benchmarks/tiers.md with the projection for Llama-3.1-8B and 70B on p5 (`projection`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpkit.analysis.metrics import RunMetrics, load_events, load_run_metrics
from fsdpkit.infra.config import KitConfig, load_config
from fsdpkit.infra.sizing import CHECKPOINT_BYTES_PER_PARAM, CLIENT_MBPS, fsx_mbps

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "tiers.md"
GPUS_PER_NODE = 8
"""Ranks of one p5.48xlarge node."""
MODEL, SEQ_LEN, BATCH_SIZE = "small", 16, 1
INTERVAL = 2
"""Saves in the fault cases: a committed step soon after start."""
FAULT_STEP = 5
"""After the saves of steps 2 and 4 (the step-4 one may still be in flight: the restore takes step 2 or 4)."""
STEADY_INTERVAL = 10
"""Saves in the steady case: ~30 s apart, so each save's work ends well before the next is due."""
WARMUP_SAVES = 2
"""Saves of the steady case left out of its period: the first saves of a job allocate memory that every
later save reuses (with tiers, the blobs of two steps: ~1.4 s of CPU per fresh 748 MB file here, against
~0.16 s to write over a kept one; without, the stager's buffers, on the first save)."""
STEPS = {"kill": 7, "node": 7, "steady": (WARMUP_SAVES + 3) * STEADY_INTERVAL}
PEER_FLOW_MBPS = 625.0
"""One TCP flow between two EC2 instances outside a cluster placement group: 5 Gbps (EC2 user guide,
"Amazon EC2 instance network bandwidth"; the kit's p5 node group has no placement group by default). A node's
8 ranks are 8 flows."""
PROJECTED = (("Llama-3.1-8B", 8.03e9, 2), ("Llama-3.1-70B", 70.6e9, 16), ("Llama-3.1-70B", 70.6e9, 128))
"""(model, parameters, p5 nodes) the projection covers: the 8B on the kit's default GPU node group, the 70B
on 16 nodes (the smallest power of two whose 16 B per parameter of training state leaves room for 8k-token
activations on 80 GB GPUs) and on 128."""


@functools.cache
def _deployed() -> KitConfig:
    """cdk.json's settings, checked as `make deploy` checks them (without the Kubernetes objects' layer,
    which needs the CDK's node runtime and says nothing about throughput)."""
    context = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    return load_config({**context, "kubernetes.deploy_objects": False})


def fsx_aggregate_mbps() -> float:
    """The deployed FSx for Lustre's aggregate throughput, MB/s."""
    storage = _deployed().storage
    return fsx_mbps(storage.storage_gib, storage.effective_throughput_per_tib or 0)


def gpu_nodes() -> int:
    """Nodes of the GPU node group at its largest: every one restores at once after a fault."""
    return _deployed().gpu.max_nodes


def shared_mib_s() -> float:
    """One rank's share of FSx when every rank of the deployed cluster restores at once, MiB/s."""
    per_node_mbps = min(fsx_aggregate_mbps() / gpu_nodes(), CLIENT_MBPS)
    return per_node_mbps * 1e6 / GPUS_PER_NODE / (1 << 20)


@dataclass(frozen=True)
class Case:
    fault: str
    """kill, node or steady."""
    tiers: str
    """peer or off."""

    @property
    def label(self) -> str:
        return f"{self.fault}-{self.tiers}"


@dataclass
class Outcome:
    case: Case
    metrics: RunMetrics | None
    period_s: float | None
    tier_work_s: float | None = None
    """Rank 0's seconds of tier work per save (blob write + peer exchange), on the writer thread."""
    period_all_s: float | None = None
    """The period over every save interval, the warm-up's included (steady case)."""
    note: str = ""

    @property
    def stall_s(self) -> float | None:
        return None if self.metrics is None else self.metrics.stall_s

    @property
    def restore_s(self) -> float | None:
        fault = self.metrics.faults[0] if self.metrics and self.metrics.faults else None
        return None if fault is None else fault.restore_s

    @property
    def shared_bytes(self) -> int | None:
        fault = self.metrics.faults[0] if self.metrics and self.metrics.faults else None
        return None if fault is None else fault.shared_bytes

    @property
    def source(self) -> str | None:
        fault = self.metrics.faults[0] if self.metrics and self.metrics.faults else None
        return None if fault is None else fault.resume_source


def loop_period(events: list[dict], interval: int, *, warmup: int = 0) -> float | None:
    """Rank 0's seconds per step over whole save intervals: from the end of the first saved step after the
    first `warmup` saves to the end of the last one (the final save's aftermath falls after the loop, so it
    is left out)."""
    ends = {int(e["step"]): float(e["ts"]) for e in events if e["kind"] == "step" and e["rank"] == 0}
    saved = sorted(s for s in ends if s % interval == 0)[warmup:]
    if len(saved) < 2:
        return None
    return (ends[saved[-1]] - ends[saved[0]]) / (saved[-1] - saved[0])


def tier_work(events: list[dict], *, warmup: int = 0) -> float | None:
    """Rank 0's mean seconds per save of tier work (write and peer phases) during the loop, the first
    `warmup` saves left out."""
    saves = sorted({int(e["step"]) for e in events if e["kind"] == "tier" and e["rank"] == 0})
    counted = set(saves[warmup:])
    per_step: dict[int, float] = {}
    for e in events:
        tiered = e["kind"] == "tier" and e["rank"] == 0 and int(e["step"]) in counted
        if tiered and e.get("phase") in ("write", "peer"):
            per_step[int(e["step"])] = per_step.get(int(e["step"]), 0.0) + float(e["duration_s"])
    return statistics.mean(per_step.values()) if per_step else None


def run_case(case: Case, workdir: Path, index: int, *, timeout_s: float) -> Outcome:
    run_id = f"{case.label}-{index}"
    interval = STEADY_INTERVAL if case.fault == "steady" else INTERVAL
    fault = {"kill": f"kill:step={FAULT_STEP}:rank=1", "node": f"node:step={FAULT_STEP}:node=1"}.get(
        case.fault
    )
    argv = [
        sys.executable, "-m", "fsdpkit.k8s", "local", "NODES=2", "SPARES=1", f"MODEL={MODEL}",
        f"SEQ_LEN={SEQ_LEN}",
        f"BATCH_SIZE={BATCH_SIZE}", f"STEPS={STEPS[case.fault]}", f"CHECKPOINT_INTERVAL={interval}",
        "MONITOR_INTERVAL_S=0.1", f"CHECKPOINT_TIERS={case.tiers}",
        f"TRAIN.checkpoint.shared_read_mib_s={shared_mib_s():.3f}", f"RUN_ID={run_id}",
        *([f"FAULT_SPEC={fault}"] if fault else []),
        "--workdir", str(workdir), "--timeout", str(timeout_s), "--lost-pod-replace-after", "30",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    run_dir = workdir / run_id / "volumes" / "kit-local-runs" / "runs" / run_id
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return Outcome(
            case=case, metrics=None, period_s=None, note=f"exit {proc.returncode}: {' | '.join(tail)}"
        )
    events = load_events(run_dir)
    warmup = WARMUP_SAVES if case.fault == "steady" else 0
    return Outcome(
        case=case,
        metrics=load_run_metrics(run_dir),
        period_s=loop_period(events, interval, warmup=warmup),
        tier_work_s=tier_work(events, warmup=warmup),
        period_all_s=loop_period(events, interval),
    )


def plan(reps: int) -> list[Case]:
    """Every repetition runs each case with tiers and without, one after the other."""
    cases = [Case(fault, tiers) for fault in ("kill", "node", "steady") for tiers in ("peer", "off")]
    return [case for _ in range(reps) for case in cases]


def measure(reps: int, workdir: Path) -> list[Outcome]:
    outcomes = []
    for i, case in enumerate(plan(reps)):
        t0 = time.monotonic()
        outcome = run_case(case, workdir / str(i), i, timeout_s=600)
        outcomes.append(outcome)
        print(
            f"{case.label:12} restore {_fmt(outcome.restore_s)} from {outcome.source or '-'}, shared read "
            f"{_mb(outcome.shared_bytes)}, stall {_fmt(outcome.stall_s)}, loop {_fmt(outcome.period_s)}"
            f"/step ({_fmt(outcome.period_all_s)} with the warm-up), tier work {_fmt(outcome.tier_work_s)}"
            f"/save ({time.monotonic() - t0:.0f} s)" + (f"  {outcome.note}" if outcome.note else ""),
            flush=True,
        )
        shutil.rmtree(workdir / str(i), ignore_errors=True)
    return outcomes


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.0f} MB"


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def summarise(outcomes: list[Outcome]) -> dict[str, float | None]:
    """The medians per case, the RESULT figures, and the per-rank restore rates the projection uses."""

    def of(fault: str, tiers: str, attr: str) -> float | None:
        return _median([getattr(o, attr) for o in outcomes if o.case == Case(fault, tiers)])

    out: dict[str, float | None] = {}
    for fault in ("kill", "node"):
        for tiers in ("peer", "off"):
            out[f"{fault}_{tiers}_restore_s"] = of(fault, tiers, "restore_s")
    for tiers in ("peer", "off"):
        for attr in ("period_s", "stall_s", "period_all_s"):
            out[f"steady_{tiers}_{attr}"] = of("steady", tiers, attr)
    out["tier_work_s"] = of("steady", "peer", "tier_work_s")
    tiered = [out["kill_peer_restore_s"], out["node_peer_restore_s"]]
    shared = [out["kill_off_restore_s"], out["node_off_restore_s"]]
    ok = all(v is not None for v in tiered + shared)
    out["restore_ratio"] = sum(tiered) / sum(shared) if ok else None  # type: ignore[arg-type]
    reads = [o.shared_bytes for o in outcomes if o.case.tiers == "peer" and o.case.fault != "steady"]
    out["shared_reads_on_restore"] = sum(r or 0 for r in reads) if reads and None not in reads else None
    ratios = (("tier_stall_ratio", "stall_s"), ("tier_period_ratio", "period_s"))
    for name, attr in (*ratios, ("tier_period_ratio_all", "period_all_s")):
        tiered, plain = out[f"steady_peer_{attr}"], out[f"steady_off_{attr}"]
        out[name] = tiered / plain if tiered is not None and plain else None
    expected = {"kill-peer": "memory", "node-peer": "peer", "kill-off": "shared", "node-off": "shared"}
    faulted = [o for o in outcomes if o.case.fault != "steady"]  # every repetition, not the last one only
    as_expected = bool(faulted) and all(o.source == expected[o.case.label] for o in faulted)
    out["sources_as_expected"] = float(as_expected)
    blob = _median([_blob_bytes(o) for o in outcomes if o.case == Case("kill", "peer")])
    out["memory_mb_s"] = (
        blob / out["kill_peer_restore_s"] / 1e6 if blob and out["kill_peer_restore_s"] else None
    )
    return out


def _blob_bytes(o: Outcome) -> float | None:
    """One rank's memory-tier copy, bytes (the kill case's restore moved this much per rank)."""
    fault = o.metrics.faults[0] if o.metrics and o.metrics.faults else None
    if fault is None or not fault.restore_bytes or not o.metrics:
        return None
    return fault.restore_bytes / o.metrics.world_size


def result_line(s: dict[str, float | None]) -> str:
    def f(key: str, digits: int) -> str:
        value = s[key]
        return "nan" if value is None else f"{value:.{digits}f}"

    reads = s["shared_reads_on_restore"]
    return (
        f"RESULT restore_ratio={f('restore_ratio', 3)} shared_reads_on_restore="
        f"{'nan' if reads is None else int(reads)} tier_stall_ratio={f('tier_stall_ratio', 3)} "
        f"tier_period_ratio={f('tier_period_ratio', 3)}"
    )


@dataclass(frozen=True)
class Projection:
    model: str
    nodes: int
    rank_gb: float
    fsx_s: float
    memory_s: float
    peer_s: float


def projection(memory_mb_s: float, *, fsx_mbps_total: float) -> list[Projection]:
    """Seconds to restore the state after a fault on p5, per model and node count, by where it is read:
    FSx (every node reads its share at once: the aggregate divided over the nodes, at most a node's client
    bandwidth), the node's memory (a rank's copy at the rate this benchmark measured per rank, as the node's
    8 ranks do in parallel) and a peer (the lost node's copies sent by its buddy, one 5 Gbps flow per rank;
    the survivors read memory meanwhile)."""
    rows = []
    for model, params, nodes in PROJECTED:
        total_gb = params * CHECKPOINT_BYTES_PER_PARAM / 1e9
        per_node_mbps = min(fsx_mbps_total / nodes, CLIENT_MBPS)
        rank_gb = total_gb / (nodes * GPUS_PER_NODE)
        memory_s = rank_gb * 1e3 / memory_mb_s
        rows.append(
            Projection(
                model=model, nodes=nodes, rank_gb=rank_gb, fsx_s=total_gb / nodes * 1e3 / per_node_mbps,
                memory_s=memory_s, peer_s=max(memory_s, rank_gb * 1e3 / PEER_FLOW_MBPS),
            )
        )  # fmt: skip
    return rows


def projection_table(rows: list[Projection]) -> str:
    lines = [
        "| model | p5 nodes | state per rank | restore from FSx | rank fault: from memory "
        "| node loss: memory + peer | memory / FSx | peer / FSx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.nodes} | {r.rank_gb:.1f} GB | {r.fsx_s:.0f} s | {r.memory_s:.1f} s | "
            f"{r.peer_s:.1f} s | {r.memory_s / r.fsx_s:.3f} | {r.peer_s / r.fsx_s:.3f} |"
        )
    return "\n".join(lines)


def write_doc(s: dict[str, float | None], outcomes: list[Outcome], reps: int, line: str) -> None:
    fsx = fsx_aggregate_mbps()
    rows = "\n".join(
        f"| {fault} | {_fmt(s[f'{fault}_peer_restore_s'])} | {_fmt(s[f'{fault}_off_restore_s'])} |"
        for fault in ("kill", "node")
    )
    proj = projection(s["memory_mb_s"] or 1.0, fsx_mbps_total=fsx)
    state = _mb(_median([_blob_bytes(o) for o in outcomes]))
    DOC.write_text(
        "## Memory tiers: restores from memory and peers against shared storage (CPU)\n\n"
        f"`python -m bench.tiers`: the kit trainer, MODEL={MODEL} ({state} of state per rank), 2 pods x 1 "
        f"rank + 1 spare through `python -m fsdpkit.k8s local`, async checkpoints every "
        f"{INTERVAL} steps, fault at step {FAULT_STEP}; {reps} interleaved repetition(s) of each case with "
        f"CHECKPOINT_TIERS=peer and off, {time.strftime('%Y-%m-%d')}. Shared reads paced at "
        f"{shared_mib_s():.1f} MiB/s per rank: FSx {fsx:.0f} MB/s (cdk.json) over {gpu_nodes()} p5 nodes x "
        f"{GPUS_PER_NODE} ranks restoring at once.\n\n"
        "| fault | restore with tiers | restore from shared storage |\n|---|---:|---:|\n"
        f"{rows}\n\n"
        f"Without faults, saves every {STEADY_INTERVAL} steps, measured after the first {WARMUP_SAVES} "
        "(which allocate the tiers' memory once per job; the period with them counted was "
        f"{_fmt(s['steady_peer_period_all_s'])}/step with tiers and "
        f"{_fmt(s['steady_off_period_all_s'])}/step without): the loop was blocked by checkpoints "
        f"{_fmt(s['steady_peer_stall_s'])} with tiers and {_fmt(s['steady_off_stall_s'])} without (the "
        f"kit's stall); its period was {_fmt(s['steady_peer_period_s'])}/step with tiers and "
        f"{_fmt(s['steady_off_period_s'])}/step without: the tiers' work per save (sealing the blob the host "
        f"copy was staged into, and the peer exchange: {_fmt(s['tier_work_s'])} on the writer thread) "
        "shares this machine's 2 cores and memory bandwidth with the training threads. Restore sources as "
        "expected (kill: "
        f"memory, node: peer; off: shared): {int(s['sources_as_expected'] or 0)}. One rank's memory restore "
        f"ran at {s['memory_mb_s'] or 0:.0f} MB/s here.\n\n"
        "### Projection on p5 (formulas in `bench/tiers.py`, `projection`)\n\n"
        f"FSx {fsx:.0f} MB/s aggregate (cdk.json), at most {CLIENT_MBPS} MB/s per node client; memory at "
        "the per-rank rate measured above (a p5 host copies faster); a peer at "
        f"{PEER_FLOW_MBPS:.0f} MB/s per rank (one 5 Gbps TCP flow, no placement group).\n\n"
        f"{projection_table(proj)}\n\n{line}\n",
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tiers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition; prints only")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default: 1 quick, 3 full)")
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    print(
        f"shared storage paced at {shared_mib_s():.1f} MiB/s per rank (FSx {fsx_aggregate_mbps():.0f} MB/s "
        f"over {gpu_nodes()} p5 nodes x {GPUS_PER_NODE} ranks)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tiers-") as tmp:
        outcomes = measure(reps, Path(tmp))
    s = summarise(outcomes)
    line = result_line(s)
    print(
        projection_table(projection(s["memory_mb_s"] or 1.0, fsx_mbps_total=fsx_aggregate_mbps())), flush=True
    )
    if not args.quick:
        write_doc(s, outcomes, reps, line)
    ratio_all = s["tier_period_ratio_all"]
    print(
        f"steady period ratio with the first {WARMUP_SAVES} saves (the tiers' one-time allocation) counted: "
        + ("nan" if ratio_all is None else f"{ratio_all:.3f}"),
        flush=True,
    )
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
