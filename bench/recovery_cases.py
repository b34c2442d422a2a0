"""The recovery benchmark's cases and how one runs: the job, the faults, the launcher command lines,
and where a recovery's time goes."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdpkit.analysis.metrics import DETECTION_KINDS, RunMetrics, load_run_metrics
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN, BATCH_SIZE, LOG_EVERY = 64, 2, 50
"""The job's shape, the same for the single-fault and the node cases (the ratio compares like with like)."""
JOB = [
    "--model.name", "tiny", "--data.seq_len", str(SEQ_LEN), "--data.batch_size", str(BATCH_SIZE),
    "--optim.warmup_steps", "3", "--training.log_every", str(LOG_EVERY), "--checkpoint.mode", "async",
    "--checkpoint.interval", "5",
]  # fmt: skip
FAULT_STEP = 12
"""Two steps after the step-10 checkpoint: every mechanism redoes the same two steps."""
HANG_STEP = 24
"""Hangs come after the kit launcher has learned the step time (20 steps), also two after a checkpoint."""
FREE_STEPS = {True: 60, False: 200}
"""Fault-free run length (quick, full): quick keeps 8 checkpoint cycles after learning, to fit 3 minutes."""
COLLECTIVE_TIMEOUT_S = 10
"""Gloo timeout of the in-process runs: bounds the Wrapper's recovery (reference/torch-on-cpu.md §5.3)."""
NVRX_HB_TIMEOUT_S = 5
NVRX_MECHANISMS = ("ft_launcher", "nvrx-wrapper")
"""Skipped by --quick where NVRx is not installed (the kit's own figures need no NVRx)."""


@dataclass(frozen=True, kw_only=True)
class Case:
    mechanism: str
    fault: str
    """Fault kind for a single-fault run, "none" for the fault-free run, "schedule" for the 5-fault run."""
    steps: int = 0
    """Steps of the run; 0 means the fault step + 2."""
    trainer: tuple[str, ...] = ()
    at_step: int | None = None
    """The fault's step; None: FAULT_STEP, or HANG_STEP for hang and sigstop."""

    @property
    def fault_step(self) -> int:
        if self.at_step is not None:
            return self.at_step
        return HANG_STEP if self.fault in ("hang", "sigstop") else FAULT_STEP

    @property
    def total_steps(self) -> int:
        return self.steps or self.fault_step + 2


@dataclass(frozen=True, kw_only=True)
class NodeCase:
    """A node-level fault on a 2-pod local Job (k8s/local.py), under one mechanism."""

    mechanism: str
    """kit+spare, kit, torchrun or ft_launcher."""
    fault: str
    """node (every process of the pod SIGKILLed), freeze (SIGSTOPped: a silent host) or drain."""
    node: int

    @property
    def label(self) -> str:
        return f"{self.fault}@pod{self.node}"


NODE_STEPS = FAULT_STEP + 4
SPARE_REPLACEMENT_AFTER_S = 5
"""With a spare, the lost pod's replacement starts this long after the loss (`k8s local
--lost-pod-replace-after`). A spare's recovery does not wait for it, and on EKS it comes 40-340 s later on
another node; started at once on this machine, its launcher and zygote importing torch took the cores the
recovery ran on (node loss with a spare 3.1-4.4 s, against 2.8-3.1 s with the replacement 8 s later, 4
repetitions each). 5 s clears the recovery (~3 s). The mechanisms that wait for the replacement (kit
without a spare, torchrun, ft_launcher) get it at once, their best case."""
NODE_MECHANISMS = {
    "kit+spare": ["LAUNCHER=kit", "SPARES=1", "--lost-pod-replace-after", str(SPARE_REPLACEMENT_AFTER_S)],
    "kit": ["LAUNCHER=kit"], "torchrun": ["LAUNCHER=torchrun"], "ft_launcher": ["LAUNCHER=ft_launcher"],
}  # fmt: skip


@dataclass(kw_only=True)
class NodeOutcome:
    case: NodeCase
    returncode: int
    wall_s: float
    metrics: RunMetrics | None
    note: str = ""
    phases: dict[str, float] | None = None
    """recovery_phases of the run (None if an event is missing)."""

    @property
    def survived(self) -> bool:
        return (
            self.returncode == 0 and self.metrics is not None and self.metrics.steps_completed == NODE_STEPS
        )


def run_node_case(case: NodeCase, workdir: Path, *, timeout_s: float) -> NodeOutcome:
    """`python -m fsdpkit.k8s local` with the case's launcher and fault; metrics from the run folder's
    events."""
    run_id = f"n-{case.mechanism}-{case.fault}{case.node}".replace("+", "-").replace("_", "-")
    argv = [
        sys.executable, "-m", "fsdpkit.k8s", "local", "NODES=2", f"STEPS={NODE_STEPS}",
        "CHECKPOINT_INTERVAL=5",
        "MONITOR_INTERVAL_S=0.1", "MAX_RESTARTS=8", f"SEQ_LEN={SEQ_LEN}", f"BATCH_SIZE={BATCH_SIZE}",
        f"LOG_EVERY={LOG_EVERY}",
        f"FAULT_SPEC={case.fault}:step={FAULT_STEP}:node={case.node}", f"RUN_ID={run_id}",
        *NODE_MECHANISMS[case.mechanism], "--workdir", str(workdir), "--timeout", str(timeout_s),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = 124, f"timed out after {timeout_s:.0f} s"
    wall = time.monotonic() - t0
    run_dir = workdir / run_id / "volumes" / "kit-local-runs" / "runs" / run_id
    events = read_events(run_dir) if (run_dir / "events").exists() else []
    try:
        metrics = load_run_metrics(run_dir) if events else None
    except ValueError as exc:
        metrics, tail = None, f"{tail}\nmetrics: {exc}"
    outcome = NodeOutcome(
        case=case, returncode=code, wall_s=wall, metrics=metrics, phases=recovery_phases(events)
    )
    if code != 0:
        failed = [line for line in tail.splitlines() if "local job failed" in line or "timed out" in line]
        outcome.note = (failed or [f"exit {code}"])[-1].strip()
    return outcome


@dataclass(kw_only=True)
class Outcome:
    case: Case
    returncode: int
    wall_s: float
    metrics: RunMetrics | None
    restarts: int
    hang_detect_s: float | None = None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] | None = None
    """recovery_phases of the run (None if an event is missing)."""


def release(workdir: Path, *, keep: bool) -> None:
    """A benchmark's scratch folder: kept (and named) with --keep, else removed."""
    if keep:
        print(f"run folders kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def trainer_args(case: Case, root: Path, run_id: str) -> list[str]:
    args = ["--run.id", run_id, "--run.root", str(root), *JOB, "--training.steps", str(case.total_steps)]
    if case.fault not in ("none", "schedule"):
        args += ["--fault.spec", f"{case.fault}:step={case.fault_step}:rank=1"]
    if case.mechanism in ("kit-inproc", "nvrx-wrapper"):
        backend = "kit" if case.mechanism == "kit-inproc" else "nvrx"
        args += [
            "--inprocess.enabled", "true", "--inprocess.backend", backend, "--inprocess.max_restarts", "8",
            "--training.collective_timeout_s", str(COLLECTIVE_TIMEOUT_S),
        ]  # fmt: skip
    return args + list(case.trainer)


def command(case: Case, root: Path, run_id: str, logs: Path) -> list[str]:
    """The launcher command line of a mechanism (each with the flags its docs recommend for this job)."""
    py, run_dir = sys.executable, root / run_id
    train = ["-m", "fsdpkit.trainer", *trainer_args(case, root, run_id)]
    restarts = ["--max-restarts", "8"]
    if case.mechanism in ("kit", "kit-exec", "kit-inproc"):
        start = ["--worker-start", "exec"] if case.mechanism == "kit-exec" else []
        return [
            py, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node", "2", *restarts, *start,
            "--heartbeat-load-timeout", "60", "--run-dir", str(run_dir), "--log-dir", str(logs), *train,
        ]  # fmt: skip
    port = free_port_run()
    endpoint = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
    if case.mechanism == "ft_launcher":
        return [
            str(Path(py).with_name("ft_launcher")), "--nnodes", "1", "--nproc-per-node", "2", *restarts,
            *endpoint, "--monitor-interval", "0.1", "--ft-initial-rank-heartbeat-timeout", "60",
            "--ft-rank-heartbeat-timeout", str(NVRX_HB_TIMEOUT_S), "--log-dir", str(logs), *train,
        ]  # fmt: skip
    if case.mechanism == "torchrun":
        return [
            py, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", *restarts, *endpoint,
            "--monitor-interval", "0.1", "--log-dir", str(logs), *train,
        ]  # fmt: skip
    if case.mechanism == "nvrx-wrapper":  # the Wrapper restarts in process; torchrun only starts it
        return [
            py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
            "--log-dir", str(logs), *train,
        ]  # fmt: skip
    raise ValueError(f"unknown mechanism {case.mechanism!r}")


def run_case(case: Case, workdir: Path, index: int, *, timeout_s: float) -> Outcome:
    run_id = f"{case.mechanism}-{case.fault}-{index}".replace("_", "-")
    root, logs = workdir / "runs", workdir / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", TMPDIR=str(workdir))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("KIT_HEARTBEAT_DIR", None)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            command(case, root, run_id, logs),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        code, tail = proc.returncode, proc.stderr[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = 124, f"timed out after {timeout_s:.0f} s"
    wall = time.monotonic() - t0
    run_dir = root / run_id
    events = read_events(run_dir) if (run_dir / "events").exists() else []
    try:
        metrics = load_run_metrics(run_dir) if events else None
    except ValueError as exc:
        metrics, tail = None, f"{tail}\nmetrics: {exc}"
    restarts = len([e for e in events if e["kind"] == "restart"])
    if case.mechanism in ("torchrun", "ft_launcher", "nvrx-wrapper"):
        # no launcher events: count the worker groups that started (attempt numbers) instead
        restarts = len({e["attempt"] for e in events if e["kind"] == "start"}) - 1 if events else 0
    hang = [e for e in events if e["kind"] == "hang_detected"]
    faults = [e for e in events if e["kind"] == "fault"]
    hang_detect = hang[0]["ts"] - faults[0]["ts"] if hang and faults else None
    outcome = Outcome(
        case=case,
        returncode=code,
        wall_s=wall,
        metrics=metrics,
        restarts=restarts,
        hang_detect_s=hang_detect,
        phases=recovery_phases(events),
    )
    if code != 0:
        outcome.note = tail.strip().splitlines()[-1] if tail.strip() else f"exit {code}"
    return outcome


PHASES = ("detect", "rendezvous", "worker start", "setup", "checkpoint load", "redo")
"""Where a recovery's time goes, in order; they add up to the recovery (fault -> end of the first step)."""


def recovery_phases(events: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Split the first fault's recovery at the launchers' and the trainers' events (None if one is missing).

    detect: fault -> the first launcher failure event; rendezvous: -> the new round's last `group_started`
    (a spare's launcher included); worker start: -> the last rank's trainer `start`; setup (process group,
    model, optimizer): -> the last rank's checkpoint load begins (`resume` ts); checkpoint load: -> the last
    rank's load ends (ts + duration_s); redo: -> the end of the last rank's first step after it.
    """
    faults = [e for e in events if e["kind"] == "fault"]
    if not faults:
        return None
    t0 = float(faults[0]["ts"])
    trainer = [e for e in events if e.get("role") == "trainer" and float(e["ts"]) > t0]
    loads: dict[Any, tuple[float, float]] = {}  # rank -> (load begins, load ends) of its first resume
    for e in trainer:
        if e["kind"] == "resume":
            loads.setdefault(e["rank"], (float(e["ts"]), float(e["ts"]) + float(e.get("duration_s") or 0.0)))
    steps = [(e["rank"], float(e["ts"])) for e in trainer if e["kind"] == "step"]
    ends = [
        min((ts for r, ts in steps if r == rank and ts > end), default=math.nan)
        for rank, (_, end) in loads.items()
    ]
    if not loads or math.isnan(max(ends)):
        return None
    load_begins = max(begin for begin, _ in loads.values())
    window = [e for e in events if t0 < float(e["ts"]) <= load_begins]
    detected = [
        float(e["ts"]) for e in window if e.get("role") == "launcher" and e["kind"] in DETECTION_KINDS
    ]
    formed = [float(e["ts"]) for e in window if e["kind"] == "group_started"]
    started = [float(e["ts"]) for e in window if e["kind"] == "start" and e.get("role") == "trainer"]
    if not (detected and formed and started):
        return None
    loaded = max(end for _, end in loads.values())
    marks = [t0, min(detected), max(formed), max(started), load_begins, loaded, max(ends)]
    return {name: b - a for name, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True)}


REPS = {True: 2, False: 7}
"""Default repetitions of each RESULT ratio's numerator and denominator (quick, full). Full: a kit kill's
recovery scatters by ~20 % run to run (torch's random 0-0.3 s re-rendezvous delay on ~1.5 s); the median of 7
cuts that to ~9 %, and 7 keeps the full run near 23 minutes on an idle 2-core machine."""
