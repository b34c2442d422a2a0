"""Recovery from a live replica against the memory tier: the same HSDP job, the same crash, side by side.

`python -m bench.replica [--quick] [--reps N]` runs the kit's trainer under the kit launcher, 4 ranks on one
node as HSDP (2 replicas x 2 ranks per shard group), async checkpoints every INTERVAL steps with the node's
memory tier, in-process restart on. Cases, interleaved per rep (a slow minute of the machine hits all):
  reference  no fault: the bitwise oracle, and HSDP's step time
  fsdp       no fault, the same 4 ranks as 1-D FSDP (`parallel.replicate=1`): hsdp_step_ratio's denominator
  replica    `--rank-restart in-place`: rank 1 SIGKILLed at the top of step CRASH_STEP (started again alone,
             it receives its shard from its replica, rank 3), then rank 3 torn inside the update of step
             TORN_STEP (test hook KIT_FAULT_TEST_IN_UPDATE: rank 1 sends it the step it completed)
  memory     `--rank-restart group` (the launcher's default): the same crash restarts the worker group,
             which restores the last commit from the node's memory tier and computes the steps since again
  node_replica / node_memory  the same job through the rendered manifests and the local runner, 2 pods x 2
             ranks (a replica each) and a hot spare, pod 1 lost at step CRASH_STEP: with in-process restart
             (`make train-job` adds `--rank-restart in-place`) the spare takes its place in the running round
             and receives its shards from pod 0's ranks; without it the group re-forms with the spare, which
             gets pod 1's last commit from its buddy's memory tier
  steady     no fault, saves every STEADY_INTERVAL steps, tiers `local` and `off`: what the tiers cost the
             loop on this job (bench.tiers measures the same on its larger job)

Figures, from each run's events (fsdpkit.analysis.metrics): a fault's recovery (from the fault to the end of
the first step after the resume), the steps computed again, the bytes read from shared storage during
restores; the final checkpoint against the reference's (compare_checkpoints: every tensor bitwise).
RESULT lost_steps=<steps computed again, every fault of the replica cases> shared_bytes=<bytes the replica
cases' restores read from shared storage> equal_on_disk=<1: the replica cases' final checkpoints equal the
reference's> replica_vs_memory=<recovery via a replica / via the memory tier, the crash and the lost node
summed> hsdp_step_ratio=
<HSDP step / FSDP step, fault-free> tier_period_ratio=<steady loop period with tiers / without>; goals:
lost_steps <= faults (only interrupted steps), shared_bytes 0, equal_on_disk 1, replica_vs_memory <= 1.0,
tier_period_ratio <= 1.05. hsdp_step_ratio has no goal here: on one CPU node both layouts move the same bytes
over loopback (HSDP adds an all-reduce across replicas and shrinks the all-gathers), so it says what the
extra collective costs, not what NVLink against EFA saves (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.tiers import loop_period
from fsdpkit.analysis.metrics import RunMetrics, load_events, load_run_metrics
from fsdpkit.resilience.checkpoint.compare import compare_checkpoints, final_checkpoint

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "replica.md"
RANKS = 4
STEPS = 10
INTERVAL = 3
CRASH_STEP, TORN_STEP = 6, 8
"""The crash comes 2 steps after the save of step 3 committed (the memory tier computes 4 and 5 again)."""
STEADY_INTERVAL, STEADY_STEPS = 4, 16
CASES = (
    "reference", "fsdp", "replica", "memory", "node_replica", "node_memory", "steady_tiers", "steady_off",
)  # fmt: skip
REPLICA_CASES = ("replica", "node_replica")


@dataclass(frozen=True)
class Case:
    name: str
    model: str

    def trainer_args(self, root: Path, run_id: str) -> list[str]:
        steady = self.name.startswith("steady")
        args = [
            "--run.id", run_id, "--run.root", str(root), "--model.name", self.model, "--data.seq_len", "64",
            "--data.batch_size", "2", "--optim.warmup_steps", "3", "--training.log_every", "1",
            "--training.steps", str(STEADY_STEPS if steady else STEPS), "--checkpoint.interval",
            str(STEADY_INTERVAL if steady else INTERVAL), "--inprocess.enabled", "true",
            "--parallel.replicate", "1" if self.name == "fsdp" else "2",
            "--checkpoint.tiers", "off" if self.name == "steady_off" else "local",
        ]  # fmt: skip
        if self.name in ("replica", "memory"):
            args += ["--fault.spec", f"kill:step={CRASH_STEP}:rank=1"]
        return args

    @property
    def local(self) -> bool:
        """Through the rendered manifests and the local runner (2 pods x 2 ranks and a spare)."""
        return self.name.startswith("node_")

    def values(self, run_id: str) -> list[str]:
        """The local runner's values: the same job as `trainer_args`, pod 1 lost at CRASH_STEP."""
        return [
            "PROFILE=local", "NODES=2", "PROCS_PER_NODE=2", "SPARES=1", f"MODEL={self.model}", "SEQ_LEN=64",
            "BATCH_SIZE=2", f"STEPS={STEPS}", f"CHECKPOINT_INTERVAL={INTERVAL}", "MONITOR_INTERVAL_S=0.1",
            "TRAIN.optim.warmup_steps=3", "TRAIN.parallel.replicate=2", "CHECKPOINT_TIERS=peer",
            f"INPROCESS={'true' if self.name == 'node_replica' else 'false'}",
            f"FAULT_SPEC=node:step={CRASH_STEP}:node=1", f"RUN_ID={run_id}",
        ]  # fmt: skip

    def launcher_args(self) -> list[str]:
        return ["--rank-restart", "in-place"] if self.name == "replica" else []

    def env(self) -> dict[str, str]:
        torn = {"KIT_FAULT_TEST_IN_UPDATE": f"exception:step={TORN_STEP}:rank=3"}
        return torn if self.name == "replica" else {}


@dataclass(frozen=True)
class Figures:
    """One run's figures, from its events."""

    faults: int = 0
    lost_steps: int = 0
    """Steps computed before a fault that were computed again, every fault."""
    shared_bytes: int = 0
    """Bytes read from the shared checkpoint folder during restores, every fault."""
    crash_recovery_s: float | None = None
    """The crash's (`kill`) or the lost node's (`node`) recovery: from the fault to the end of the first step
    after its resume."""
    step_s: float | None = None
    """Median fault-free step (rank 0)."""
    period_s: float | None = None
    """Loop period over whole save intervals (rank 0): bench.tiers' `loop_period`."""

    @classmethod
    def of(cls, metrics: RunMetrics, period_s: float | None) -> Figures:
        faults = metrics.faults
        return cls(
            faults=len(faults),
            lost_steps=sum(f.lost_steps or 0 for f in faults),
            shared_bytes=sum(f.shared_bytes or 0 for f in faults),
            crash_recovery_s=next((f.recovery_s for f in faults if f.kind in ("kill", "node")), None),
            step_s=metrics.median_step_s or None,
            period_s=period_s,
        )


@dataclass
class Outcome:
    case: str
    figures: Figures | None
    """None when the run failed (`note` says how)."""
    run_dir: Path | None = None
    equal_on_disk: bool | None = None
    """The replica case: its final checkpoint equals the same rep's reference (every tensor bitwise)."""
    note: str = ""


def run_case(case: Case, workdir: Path, index: int, *, timeout_s: float) -> Outcome:
    run_id = f"{case.name.replace('_', '-')}-{index}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir), **case.env()}
    if case.local:
        run_dir = workdir / run_id / "volumes" / "kit-local-runs" / "runs" / run_id
        cmd = [
            sys.executable, "-m", "fsdpkit.k8s", "local", *case.values(run_id), "--workdir", str(workdir),
            "--timeout", str(int(timeout_s)),
        ]  # fmt: skip
    else:
        root = workdir / "runs"
        run_dir = root / run_id
        cmd = [
            sys.executable, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node", str(RANKS),
            "--log-dir", str(workdir / "logs" / run_id), "--run-dir", str(run_dir), *case.launcher_args(),
            "-m", "fsdpkit.trainer", *case.trainer_args(root, run_id),
        ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return Outcome(case.name, None, note=f"exit {proc.returncode}: {' | '.join(tail)}")
    interval = STEADY_INTERVAL if case.name.startswith("steady") else INTERVAL
    period = loop_period(load_events(run_dir), interval)
    return Outcome(case.name, Figures.of(load_run_metrics(run_dir), period), run_dir)


def measure(reps: int, workdir: Path, *, model: str, timeout_s: float) -> list[Outcome]:
    outcomes = []
    for index in range(reps):
        rep: dict[str, Outcome] = {}
        for name in CASES:
            t0 = time.monotonic()
            rep[name] = outcome = run_case(Case(name, model), workdir, index, timeout_s=timeout_s)
            took = time.monotonic() - t0
            print(
                f"[bench.replica] rep {index} {name}: {took:.0f} s {outcome.figures} {outcome.note}",
                flush=True,
            )
        reference = rep["reference"]
        for replica in (rep[name] for name in REPLICA_CASES):
            if replica.run_dir is not None and reference.run_dir is not None:
                mine, ref = final_checkpoint(replica.run_dir), final_checkpoint(reference.run_dir)
                replica.equal_on_disk = compare_checkpoints(mine, ref).equal
        outcomes.extend(rep.values())
    return outcomes


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(outcomes: list[Outcome]) -> dict[str, float | None]:
    """The medians per case and the RESULT figures; per rep for the replica case's counts."""

    def runs(case: str) -> list[Figures]:
        return [o.figures for o in outcomes if o.case == case and o.figures is not None]

    def median(case: str, attr: str) -> float | None:
        return _median([getattr(f, attr) for f in runs(case)])

    replica = [o for o in outcomes if o.case in REPLICA_CASES]
    equal = [o.equal_on_disk for o in replica]

    def summed(case: str) -> float | None:  # a case's figure, summed over the replica cases' faults
        return _sum([median(case, "lost_steps"), median(f"node_{case}", "lost_steps")])

    via_replica = _sum([median("replica", "crash_recovery_s"), median("node_replica", "crash_recovery_s")])
    via_memory = _sum([median("memory", "crash_recovery_s"), median("node_memory", "crash_recovery_s")])
    return {
        "faults": _sum([median("replica", "faults"), median("node_replica", "faults")]),
        "lost_steps": summed("replica"),
        "memory_lost_steps": summed("memory"),
        "shared_bytes": _sum([median("replica", "shared_bytes"), median("node_replica", "shared_bytes")]),
        "equal_on_disk": (1.0 if all(equal) else 0.0) if equal and None not in equal else None,
        "crash_replica_s": median("replica", "crash_recovery_s"),
        "crash_memory_s": median("memory", "crash_recovery_s"),
        "node_replica_s": median("node_replica", "crash_recovery_s"),
        "node_memory_s": median("node_memory", "crash_recovery_s"),
        "replica_vs_memory": _ratio(via_replica, via_memory),
        "hsdp_step_s": median("reference", "step_s"),
        "fsdp_step_s": median("fsdp", "step_s"),
        "hsdp_step_ratio": _ratio(median("reference", "step_s"), median("fsdp", "step_s")),
        "tier_period_ratio": _ratio(median("steady_tiers", "period_s"), median("steady_off", "period_s")),
    }


def _sum(values: list[float | None]) -> float | None:
    """The sum, or None when any part is missing (a failed run must not look like a fast one)."""
    return None if any(v is None for v in values) else float(sum(v for v in values if v is not None))


def result_line(s: dict[str, float | None]) -> str:
    def f(key: str, digits: int) -> str:
        value = s.get(key)
        return "nan" if value is None else f"{value:.{digits}f}"

    return (
        f"RESULT lost_steps={f('lost_steps', 0)} shared_bytes={f('shared_bytes', 0)} "
        f"equal_on_disk={f('equal_on_disk', 0)} replica_vs_memory={f('replica_vs_memory', 3)} "
        f"hsdp_step_ratio={f('hsdp_step_ratio', 3)} tier_period_ratio={f('tier_period_ratio', 3)}"
    )


def _f(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def write_doc(s: dict[str, float | None], reps: int, line: str) -> None:
    """docs/benchmarks/replica.md: the figures, the command, what each case is."""
    rows = [
        ("a crash (rank 1 SIGKILLed)", s["crash_replica_s"], s["crash_memory_s"]),
        ("a lost node (pod 1), a hot spare", s["node_replica_s"], s["node_memory_s"]),
    ]
    table = "\n".join(f"| {what} | {_f(a, unit=' s')} | {_f(b, unit=' s')} |" for what, a, b in rows)
    DOC.write_text(
        "## Recovery from a live replica against the memory tier (HSDP, CPU)\n\n"
        f"`python -m bench.replica` ({reps} interleaved repetition(s) of each case, "
        f"{time.strftime('%Y-%m-%d')}): the kit's trainer, {RANKS} ranks as HSDP 2 replicas x 2, async "
        f"checkpoints every {INTERVAL} steps, in-process restart on; the crash under the kit launcher on one "
        "node, the lost node through the rendered manifests and the local runner (2 pods x 2 ranks and a hot "
        "spare). Recovery: from the fault to the end of the first step after its resume (median).\n\n"
        "| fault | via a live replica | via the memory tier |\n|---|---:|---:|\n"
        f"{table}\n\n"
        f"Steps computed again: {_f(s['lost_steps'], 0)} via replicas (every fault: the crash, a torn "
        f"update and the lost node), {_f(s['memory_lost_steps'], 0)} via the memory tier (the steps since "
        "the last commit); bytes read from shared storage by the replica cases' restores: "
        f"{_f(s['shared_bytes'], 0)}; "
        "the replica cases' final checkpoints against the fault-free run's: "
        f"{'bitwise equal' if s['equal_on_disk'] == 1.0 else 'DIFFERENT'}.\n\n"
        f"HSDP step {_f(s['hsdp_step_s'], 3, ' s')} against 1-D FSDP's {_f(s['fsdp_step_s'], 3, ' s')} on "
        "the same 4 ranks: on one CPU node both move their bytes over loopback, so the ratio says what "
        "HSDP's extra all-reduce across replicas and its smaller all-gathers cost here, not what NVLink "
        "against EFA saves on p5 (`make plan` models that). The tiers' cost on this job's loop (saves every "
        f"{STEADY_INTERVAL} steps): {_f(s['tier_period_ratio'], 3)}x its period without them.\n\n"
        f"```\n{line}\n```\n",
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replica", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one rep of each case (about 5 minutes)")
    parser.add_argument("--reps", type=int, default=None, help="reps per case (default 1 quick, 3 full)")
    args = parser.parse_args(argv)
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    if reps < 1:
        parser.error(f"--reps must be >= 1, got {reps}")
    model = "tiny"  # the step's size changes none of what is compared here; the transfer's rate is a figure
    with tempfile.TemporaryDirectory(prefix="bench-replica-") as tmp:
        outcomes = measure(reps, Path(tmp), model=model, timeout_s=600)
        summary = summarise(outcomes)
    for key, value in summary.items():
        print(f"[bench.replica] {key} = {value}")
    line = result_line(summary)
    if not args.quick:
        write_doc(summary, reps, line)
    print(line)
    return 0 if summary["equal_on_disk"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
