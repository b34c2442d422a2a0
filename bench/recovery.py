"""Recovery benchmark: the same tiny FSDP job and the same faults under every restart mechanism, in one run.

`python -m bench.recovery [--quick] [--reps N] [--json PATH]` runs the trainer (tiny model, 2 ranks x 1
thread, gloo, async checkpoints every 5 steps) with one injected fault per run, under:
  kit          python -m training.launcher (heartbeats, learned timeout, warm zygote workers)
  kit-exec     the same launcher without the zygote (--worker-start exec), to show what the zygote buys
  ft_launcher  NVRx 0.4.1 ft_launcher (heartbeats through RankMonitorClient, 5 s heartbeat timeout)
  torchrun     torch.distributed.run --max-restarts (the baseline; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
  kit-inproc   the trainer's in-process restart (inprocess.backend=kit) under the kit launcher
  nvrx-wrapper the trainer inside NVRx inprocess.Wrapper (inprocess.backend=nvrx) under torchrun
Faults: kill (SIGKILL), hang (the training thread stops), sigstop, oom (self-imposed limit), exception; all on
rank 1 at a fixed step, once per run. Every figure comes from the run's events through
training.analysis.metrics: recovery = fault -> end of the first step after the resume; detection = fault ->
the launcher's event. Plus a fault-free run of >= 200 steps with checkpoints under the kit launcher (false
restarts) and, in full mode, the study's seeded 5-fault schedule (exception 0.6 / hang 0.4) for strict
goodput per mechanism.

Node cases (the same side-by-side run): 2 pods x 1 rank through the rendered `local` Job and the local
runner (`python -m k8s local`), in the single-fault cases' job shape, with a node-level fault: kit+spare
(SPARES=1) gets `node` on pod 1, `node` on pod 0 and `drain` on pod 1; kit without a spare (the lost pod is
recreated at once by the local runner, the best case of the Kubernetes path, which on EKS adds scheduling,
image pull and a new node) `node` on pod 1; torchrun and ft_launcher as the study deployed them (rendezvous
on pod 0) `node` on pods 1 and 0 (full mode). With a spare the lost pod's replacement (the next spare)
starts SPARE_REPLACEMENT_AFTER_S after the loss, not on the cores the recovery runs on. Reported: recovery
(fault -> end of the first step after the resume), lost steps, whether the job survived (the Job
completed), and where the spare's recovery went (recovery_phases); a baseline's lost job is reported as it
is.

Repetitions (issue 15: figures that hold still): each RESULT ratio's numerator and denominator run --reps
times (default 7, --quick 2) in this one run, interleaved (rep 1 of every case, then rep 2, ...) so that a
slow minute of the machine hits both; a ratio is the median of the per-repetition ratios, with its min-max
spread. The cases behind the doc's other claims run min(3, reps) times, the baselines' node cases once.
--json PATH records the figures; --check-stability A.json B.json C.json says whether runs agree within 10 %.

Last line: `RESULT kill_recovery_ratio=<kit / ft_launcher> inprocess_ratio=<kit-inproc / nvrx-wrapper>
hang_detect_steps=<kit hang detection / median step time> false_restarts=<restarts in the fault-free run>
node_recovery_ratio=<kit+spare node loss / kit single-rank kill> pod0_survived=<1 if every rep survived|0>
drain_lost_steps=<most lost in a rep> node_freeze_ratio=<kit+spare silent node loss (freeze) / kit
kill>`. Full mode writes docs/benchmarks/recovery.md (keeping its
hand-written notes); --quick (the RESULT cases only) only prints.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import stability
from training.analysis.metrics import DETECTION_KINDS, RunMetrics, load_run_metrics
from training.contracts.ports import free_port_run
from training.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "recovery.md"
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
    """`python -m k8s local` with the case's launcher and fault; metrics from the run folder's events."""
    run_id = f"n-{case.mechanism}-{case.fault}{case.node}".replace("+", "-").replace("_", "-")
    argv = [
        sys.executable, "-m", "k8s", "local", "NODES=2", f"STEPS={NODE_STEPS}", "CHECKPOINT_INTERVAL=5",
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
    train = ["-m", "training.trainer", *trainer_args(case, root, run_id)]
    restarts = ["--max-restarts", "8"]
    if case.mechanism in ("kit", "kit-exec", "kit-inproc"):
        start = ["--worker-start", "exec"] if case.mechanism == "kit-exec" else []
        return [
            py, "-m", "training.launcher", "--standalone", "--nproc-per-node", "2", *restarts, *start,
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


@dataclass(frozen=True, kw_only=True)
class Figure:
    """A RESULT figure of one run: the median over its repetitions and their spread."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    """Repetitions that gave a value (a ratio's numerator and denominator both measured in the same rep)."""

    def text(self, digits: int = 2) -> str:
        return "nan" if self.value is None else f"{self.value:.{digits}f}"

    def spread(self, digits: int = 2) -> str:
        if self.low is None or self.high is None:
            return "-"
        return f"{self.low:.{digits}f}-{self.high:.{digits}f}"


RATIO_KEYS = (
    "kill_recovery_ratio", "inprocess_ratio", "hang_detect_steps", "node_recovery_ratio", "node_freeze_ratio",
)  # fmt: skip
"""RESULT figures compared by relative spread across runs (--check-stability)."""
COUNT_KEYS = ("false_restarts", "pod0_survived", "drain_lost_steps")
"""RESULT figures that are whole numbers: runs agree only if they are equal."""
RESULT_KEYS = ("kill_recovery_ratio", "inprocess_ratio", "hang_detect_steps", "false_restarts",
               "node_recovery_ratio", "pod0_survived", "drain_lost_steps", "node_freeze_ratio")  # fmt: skip
"""The RESULT line's figures, in its order (bench/goodput.py and the docs read them by name)."""


def recovery(o: Outcome) -> float | None:
    if o.metrics is None or not o.metrics.faults:
        return None
    return o.metrics.faults[0].recovery_s


def detection(o: Outcome) -> float | None:
    if o.metrics is None or not o.metrics.faults:
        return None
    return o.metrics.faults[0].detect_s


def node_recovery(o: NodeOutcome) -> float | None:
    f = _node_fault(o)
    return None if f is None else f.recovery_s


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def fmt(value: float | None, unit: str = " s") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def figure(values: Sequence[float | None]) -> Figure:
    present = [v for v in values if v is not None]
    if not present:
        return Figure(value=None, low=None, high=None, n=0)
    return Figure(value=statistics.median(present), low=min(present), high=max(present), n=len(present))


def paired_ratio(nums: Sequence[float | None], dens: Sequence[float | None]) -> Figure:
    """Median and spread of the per-repetition ratios num[i] / den[i] (interleaved: one drift hits both)."""
    ratios = [a / b if a is not None and b else None for a, b in zip(nums, dens, strict=False)]
    return figure(ratios)


REPS = {True: 2, False: 7}
"""Default repetitions of each RESULT ratio's numerator and denominator (quick, full). Full: a kit kill's
recovery scatters by ~20 % run to run (torch's random 0-0.3 s re-rendezvous delay on ~1.5 s); the median of 7
cuts that to ~9 %, and 7 keeps the full run near 23 minutes on an idle 2-core machine."""


def plan(quick: bool, *, reps: int, nvrx: bool) -> list[tuple[Case | NodeCase, int]]:
    """Every repeated case with its repetitions: each ratio's numerator and denominator `reps` times; the
    cases behind the doc's other claims min(3, reps) times; the baselines' node cases once."""
    claim = min(3, reps)
    ratio_cases: list[Case | NodeCase] = [
        Case(mechanism="kit", fault="kill"),
        Case(mechanism="ft_launcher", fault="kill"),
        Case(mechanism="kit", fault="hang"),
        Case(mechanism="kit-inproc", fault="exception"),
        Case(mechanism="nvrx-wrapper", fault="exception"),
        NodeCase(mechanism="kit+spare", fault="node", node=1),
        NodeCase(mechanism="kit+spare", fault="freeze", node=1),
    ]
    planned = [(c, reps) for c in ratio_cases]
    # pod0_survived and drain_lost_steps: the worst repetition counts
    planned += [(NodeCase(mechanism="kit+spare", fault=f, node=n), 1 if quick else claim)
                for f, n in (("node", 0), ("drain", 1))]  # fmt: skip
    if not quick:
        planned += [
            (Case(mechanism=m, fault=f), claim)
            for m, f in (
                ("torchrun", "kill"), ("kit-exec", "kill"), ("ft_launcher", "hang"), ("kit", "sigstop"),
                ("ft_launcher", "sigstop"), ("kit", "oom"), ("kit", "exception"),
            )
        ]  # fmt: skip
        planned += [(NodeCase(mechanism="kit", fault="node", node=1), 1)]
        # the baselines' node losses, once (their drain backs no doc claim: cut for time)
        planned += [(NodeCase(mechanism=m, fault="node", node=n), 1) for m in ("torchrun", "ft_launcher")
                    for n in (1, 0)]  # fmt: skip
    if not nvrx:
        planned = [(c, r) for c, r in planned if c.mechanism not in NVRX_MECHANISMS]
    return planned


def whole_plan(quick: bool) -> list[Case]:
    """Runs done once: the fault-free run (false restarts) and, in full mode, the 5-fault schedule."""
    whole = [Case(mechanism="kit", fault="none", steps=FREE_STEPS[quick])]
    if not quick:
        schedule = (
            "--fault.schedule_seed", "42", "--fault.schedule_count", "5", "--fault.schedule_after_step", "10",
            "--fault.schedule_kinds", "exception:0.6,hang:0.4",
        )  # fmt: skip
        whole += [
            Case(mechanism=m, fault="schedule", steps=80, trainer=schedule)
            for m in ("kit", "kit-inproc", "ft_launcher")
        ]
    return whole


@dataclass(kw_only=True)
class Results:
    """Every outcome of one benchmark run, by case, in the order the repetitions ran."""

    single: dict[Case, list[Outcome]] = field(default_factory=dict)
    nodes: dict[NodeCase, list[NodeOutcome]] = field(default_factory=dict)

    def of(self, mechanism: str, fault: str) -> list[Outcome]:
        return self.single.get(Case(mechanism=mechanism, fault=fault), [])

    def node(self, mechanism: str, fault: str, node: int) -> list[NodeOutcome]:
        return self.nodes.get(NodeCase(mechanism=mechanism, fault=fault, node=node), [])


def figures(results: Results) -> dict[str, Figure]:
    """The RESULT figures: medians over the repetitions, ratios paired per repetition."""

    def rec(mechanism: str, fault: str) -> list[float | None]:
        return [recovery(o) for o in results.of(mechanism, fault)]

    hangs = results.of("kit", "hang")
    steps = [o.metrics.median_step_s if o.metrics else None for o in hangs]
    free = [o for c, outs in results.single.items() if c.fault == "none" for o in outs]
    pod0 = results.node("kit+spare", "node", 0)
    drains = [_node_fault(o) for o in results.node("kit+spare", "drain", 1)]
    lost = [f.lost_steps for f in drains if f is not None and f.lost_steps is not None]
    survived = [int(o.survived) for o in pod0]
    restarts = [o.restarts for o in free]
    return {
        "kill_recovery_ratio": paired_ratio(rec("kit", "kill"), rec("ft_launcher", "kill")),
        "inprocess_ratio": paired_ratio(rec("kit-inproc", "exception"), rec("nvrx-wrapper", "exception")),
        "hang_detect_steps": paired_ratio([o.hang_detect_s for o in hangs], steps),
        "false_restarts": _worst(restarts, max),
        "node_recovery_ratio": paired_ratio(
            [node_recovery(o) for o in results.node("kit+spare", "node", 1)], rec("kit", "kill")
        ),
        "node_freeze_ratio": paired_ratio(
            [node_recovery(o) for o in results.node("kit+spare", "freeze", 1)], rec("kit", "kill")
        ),
        "pod0_survived": _worst(survived, min),
        "drain_lost_steps": _worst(lost, max),
    }


def _worst(values: list[int], pick: Callable[[list[int]], int]) -> Figure:
    """A count over the repetitions: the worst one is the figure (a job lost once is not survived)."""
    if not values:
        return Figure(value=None, low=None, high=None, n=0)
    return Figure(value=pick(values), low=min(values), high=max(values), n=len(values))


def result_line(figs: Mapping[str, Figure]) -> str:
    """`RESULT k=v ...` in RESULT_KEYS order: ratios to 2 decimals, counts whole."""
    return "RESULT " + " ".join(f"{k}={figs[k].text(2 if k in RATIO_KEYS else 0)}" for k in RESULT_KEYS)


def check_stability(paths: Sequence[Path]) -> int:
    """`--check-stability RUN.json ...`: a line per RESULT figure, then the verdict (exit 0: all agree)."""
    return stability.check_stability(paths, RESULT_KEYS, bench="bench.recovery", counts=COUNT_KEYS)


def to_json(
    figs: Mapping[str, Figure], results: Results, *, reps: int, quick: bool, elapsed_s: float
) -> dict:
    """The per-run record --json writes and --check-stability reads."""

    def values(outcomes: Sequence[Outcome | NodeOutcome]) -> list[float | None]:
        return [recovery(o) if isinstance(o, Outcome) else node_recovery(o) for o in outcomes]

    return {
        "benchmark": "bench.recovery",
        "mode": "quick" if quick else "full",
        "reps": reps,
        "elapsed_s": round(elapsed_s, 1),
        "result": {k: f.value for k, f in figs.items()},
        "figures": {k: {"median": f.value, "min": f.low, "max": f.high, "n": f.n} for k, f in figs.items()},
        "cases": [
            {
                "mechanism": c.mechanism,
                "fault": getattr(c, "label", c.fault),
                "recovery_s": values(outs),
                "wall_s": [round(o.wall_s, 1) for o in outs],
                "phases_s": [o.phases for o in outs],
            }
            for c, outs in [*results.single.items(), *results.nodes.items()]
        ],
    }


def run_repeated(planned: Sequence[tuple[Case | NodeCase, int]], workdir: Path, results: Results) -> None:
    """Repetition 1 of every case, then repetition 2, ...: a slow minute of the machine hits every case."""
    rounds = max((reps for _, reps in planned), default=0)
    for rep in range(rounds):
        for case, reps in planned:
            if rep >= reps:
                continue
            tag = f"rep {rep + 1}/{reps}"
            if isinstance(case, NodeCase):
                node = run_node_case(case, workdir / "nodes" / f"r{rep}", timeout_s=240)
                results.nodes.setdefault(case, []).append(node)
                f = _node_fault(node)
                print(
                    f"{case.mechanism:13} {case.label:11} {tag}: exit {node.returncode}, "
                    f"survived {int(node.survived)}, recovery {fmt(f.recovery_s if f else None)}, "
                    f"lost {'-' if f is None or f.lost_steps is None else f.lost_steps}"
                    + (f"  [{node.note}]" if node.note else ""),
                    flush=True,
                )
                continue
            outcome = run_case(case, workdir, rep, timeout_s=240)
            results.single.setdefault(case, []).append(outcome)
            print(
                f"{case.mechanism:13} {case.fault:11} {tag}: exit {outcome.returncode}, "
                f"recovery {fmt(recovery(outcome))}, detection {fmt(detection(outcome))}"
                + (f"  [{outcome.note}]" if outcome.note else ""),
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the RESULT cases only, 2 repetitions, no doc")
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions of each ratio's numerator and denominator (default 7, quick 2); other cases "
        "min(3, reps)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="write the run's figures here"
    )
    parser.add_argument(
        "--check-stability",
        type=Path,
        nargs="+",
        default=None,
        metavar="RUN.json",
        help="compare the RESULT figures of runs written by --json (10 %% criterion) and exit",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = parser.parse_args(argv)
    if args.check_stability is not None:
        return check_stability(args.check_stability)
    reps = args.reps if args.reps is not None else REPS[args.quick]
    if not 1 <= reps <= 50:
        parser.error(f"--reps must be a whole number from 1 to 50, got {reps}")
    if args.json is not None and not _writable(args.json):
        parser.error(f"--json {args.json}: cannot write there; give a file in a writable folder")
    nvrx = shutil.which("ft_launcher", path=str(Path(sys.executable).parent)) is not None
    if not nvrx:
        if not args.quick:
            print(
                "error: NVRx is not installed in this environment; run `make bench-setup` "
                "(nvidia-resiliency-ext==0.4.1 from requirements-bench.txt)",
                file=sys.stderr,
            )
            return 2
        print("note: NVRx is not installed: the ft_launcher and nvrx-wrapper cases are skipped", flush=True)
    planned, whole = plan(args.quick, reps=reps, nvrx=nvrx), whole_plan(args.quick)
    if not nvrx:
        whole = [c for c in whole if c.mechanism not in NVRX_MECHANISMS]
    workdir = Path(tempfile.mkdtemp(prefix="kit-bench-recovery-"))
    started = time.monotonic()
    results = Results()
    try:
        run_repeated(planned, workdir, results)
        for case in whole:
            outcome = run_case(case, workdir, 0, timeout_s=600)
            results.single[case] = [outcome]
            m = outcome.metrics
            print(
                f"{case.mechanism:13} {case.fault:9} {case.total_steps} steps: exit {outcome.returncode}, "
                f"restarts {outcome.restarts}, goodput {fmt(m.goodput if m else None, '')}"
                + (f"  [{outcome.note}]" if outcome.note else ""),
                flush=True,
            )
    finally:
        release(workdir, keep=args.keep)
    elapsed = time.monotonic() - started
    figs = figures(results)
    table = render(results, figs, reps=reps, quick=args.quick, elapsed_s=elapsed)
    print(table)
    if args.json is not None:
        record = to_json(figs, results, reps=reps, quick=args.quick, elapsed_s=elapsed)
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if not args.quick:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(with_notes(table, DOC), encoding="utf-8")
        print(f"wrote {DOC.relative_to(REPO)}")
    print(result_line(figs))
    return 0


def _writable(path: Path) -> bool:
    """Checked before the run, so that a bad --json path does not cost the whole run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return not path.is_dir() and os.access(path.parent, os.W_OK)


NOTES_MARK = "<!-- notes below: written by hand, kept when bench.recovery rewrites this file -->"


def with_notes(table: str, doc: Path) -> str:
    """The new tables plus the hand-written reading notes of the old file (after NOTES_MARK)."""
    old = doc.read_text(encoding="utf-8") if doc.exists() else ""
    _, mark, notes = old.partition(NOTES_MARK)
    return table.rstrip() + "\n\n" + NOTES_MARK + notes if mark else table


def _node_fault(o: NodeOutcome | None):  # type: ignore[no-untyped-def]
    return o.metrics.faults[0] if o is not None and o.metrics is not None and o.metrics.faults else None


def _runs(values: Sequence[float | None]) -> str:
    f = figure(values)
    return f"{fmt(f.value)} | {f.spread()} | {f.n}"


def render(results: Results, figs: Mapping[str, Figure], *, reps: int, quick: bool, elapsed_s: float) -> str:
    mode = " ".join((["--quick"] if quick else []) + ([f"--reps {reps}"] if reps != REPS[quick] else []))
    others = 1 if quick else min(3, reps)
    lines = [
        "## Recovery: kit launcher and in-process restart vs NVRx and torchrun",
        "",
        f"Command: `python -m bench.recovery{' ' + mode if mode else ''}` ({elapsed_s / 60:.1f} min on this "
        "machine, every case below in this one run).",
        "Same job for every mechanism: tiny Llama, 2 ranks x 1 thread (gloo), async checkpoints every 5",
        f"steps; one fault on rank 1 at the top of step {FAULT_STEP} (hang, sigstop: step {HANG_STEP}), two",
        "steps after the last checkpoint. Recovery = fault -> end of the first step after the resume;",
        "detection = fault -> the launcher's event (training.analysis.metrics). Repetitions interleaved",
        f"(rep 1 of every case, then rep 2, ...): {reps} of each RESULT ratio's cases, {others} of the",
        "others (the no-spare and baseline node cases: 1); n = runs that gave a figure; spread = min-max",
        "over them.",
        "",
        "| mechanism | fault | recovery (median) | spread | n | detection (median) | median step | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, outcomes in results.single.items():
        if case.fault in ("none", "schedule"):
            continue
        det = [o.hang_detect_s if case.fault in ("hang", "sigstop") else detection(o) for o in outcomes]
        steps = median([o.metrics.median_step_s if o.metrics else None for o in outcomes])
        notes = "; ".join(sorted({o.note for o in outcomes if o.note}))
        lines.append(
            f"| {case.mechanism} | {case.fault} | {_runs([recovery(o) for o in outcomes])} | "
            f"{fmt(median(det))} | {fmt(steps)} | {notes} |"
        )
    lines += [
        "",
        "| run | steps | exit | restarts | wall | median step | strict goodput | training goodput | faults |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, outcomes in results.single.items():
        if case.fault not in ("none", "schedule"):
            continue
        o, m = outcomes[0], outcomes[0].metrics
        lines.append(
            f"| {case.mechanism} {case.fault} | {case.total_steps} | {o.returncode} | {o.restarts} | "
            f"{o.wall_s:.1f} s | {fmt(m.median_step_s if m else None)} | "
            f"{fmt(m.goodput if m else None, '')} | {fmt(m.training_goodput if m else None, '')} | "
            f"{len(m.faults) if m else 0} |"
        )
    lines += [
        "",
        "Mechanisms: kit = `python -m training.launcher` (learned heartbeat timeout, warm zygote",
        "workers); kit-exec = the same without the zygote; ft_launcher = NVRx 0.4.1 (5 s heartbeat timeout);",
        "torchrun = `torch.distributed.run --max-restarts` (baseline); kit-inproc, nvrx-wrapper = in-process",
        f"restart (the kit's, NVRx inprocess.Wrapper) with a {COLLECTIVE_TIMEOUT_S} s gloo timeout. Strict",
        "goodput = steps in the result x median fault-free step / wall (training.analysis.metrics).",
    ]
    return "\n".join(lines + render_nodes(results) + render_figures(figs)) + "\n"


def render_nodes(results: Results) -> list[str]:
    lines = [
        "",
        "## Node loss and drain: kit with and without a spare vs torchrun and ft_launcher",
        "",
        f"2 pods x 1 rank through `python -m k8s local` (tiny model, {NODE_STEPS} steps, checkpoints",
        f"every 5); the fault at the top of step {FAULT_STEP} on the named pod. kit = no spare (the local",
        "runner recreates the lost pod at once, the best case of the Kubernetes path); torchrun and",
        "ft_launcher keep their rendezvous on pod 0, as the study deployed them. Recovery = fault -> end of",
        "the first step after the resume; survived = the Job completed every step (runs that did / runs).",
        "",
        "| mechanism | fault | survived | recovery (median) | spread | n | took over | lost steps | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, outcomes in results.nodes.items():
        faults = [_node_fault(o) for o in outcomes]
        lost = sorted({str(f.lost_steps) for f in faults if f is not None and f.lost_steps is not None})
        took = sorted({f.takeover for f in faults if f is not None and f.takeover})
        notes = "; ".join(sorted({o.note for o in outcomes if o.note}))
        survived = sum(o.survived for o in outcomes)
        lines.append(
            f"| {case.mechanism} | {case.label} | {survived}/{len(outcomes)} | "
            f"{_runs([node_recovery(o) for o in outcomes])} | {', '.join(took) or '-'} | "
            f"{', '.join(lost) or '-'} | {notes} |"
        )
    phased = [o.phases for o in results.node("kit+spare", "node", 1) if o.phases]
    frozen = [o.phases for o in results.node("kit+spare", "freeze", 1) if o.phases]
    kills = [o.phases for o in results.of("kit", "kill") if o.phases]
    if phased:
        lines += [
            "",
            "Where the recovery goes (recovery_phases; median s over the runs with every event): detect =",
            "fault -> first launcher failure event; rendezvous -> the new round's last `group_started`;",
            "worker start -> last trainer `start`; setup -> last checkpoint load begins; checkpoint load ->",
            "it ends; redo -> end of the redone step.",
            "",
            f"| case | n | {' | '.join(PHASES)} | total |",
            "|---|---|" + "---|" * (len(PHASES) + 1),
        ]
        for label, rows in (
            ("kit+spare node@pod1", phased),
            ("kit+spare freeze@pod1", frozen),
            ("kit kill rank 1", kills),
        ):
            if rows:
                cells = [fmt(median([r[p] for r in rows])) for p in PHASES]
                total = fmt(median([sum(r.values()) for r in rows]))
                lines.append(f"| {label} | {len(rows)} | {' | '.join(cells)} | {total} |")
    return lines


def render_figures(figs: Mapping[str, Figure]) -> list[str]:
    lines = ["", "| RESULT figure | median | spread | n |", "|---|---|---|---|"]
    for key, f in figs.items():
        digits = 2 if key in RATIO_KEYS else 0
        lines.append(f"| {key} | {f.text(digits)} | {f.spread(digits)} | {f.n} |")
    return [*lines, "", "```", result_line(figs), "```"]


if __name__ == "__main__":
    sys.exit(main())
