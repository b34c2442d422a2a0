"""Recovery benchmark: the same tiny FSDP job and the same faults under every restart mechanism, in one run.

`python -m bench.recovery [--quick] [--reps N]` runs the trainer (tiny model, 2 ranks x 1 thread, gloo, async
checkpoints every 5 steps) with one injected fault per run, under:
  kit          python -m training.launch (heartbeats, learned timeout, warm zygote workers)
  kit-exec     the same launcher without the zygote (--worker-start exec), to show what the zygote buys
  ft_launcher  NVRx 0.4.1 ft_launcher (heartbeats through RankMonitorClient, 5 s heartbeat timeout)
  torchrun     torch.distributed.run --max-restarts (the baseline; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
  kit-inproc   the trainer's in-process restart (inprocess.backend=kit) under the kit launcher
  nvrx-wrapper the trainer inside NVRx inprocess.Wrapper (inprocess.backend=nvrx) under torchrun
Faults: kill (SIGKILL), hang (the training thread stops), sigstop, oom (self-imposed limit), exception; all on
rank 1 at a fixed step, once per run. Every figure comes from the run's events through training.metrics:
recovery = fault -> end of the first step after the resume; detection = fault -> the launcher's event.
Plus a fault-free run of >= 200 steps with checkpoints under the kit launcher (false restarts) and, in full
mode, the study's seeded 5-fault schedule (exception 0.6 / hang 0.4) for strict goodput per mechanism.

Node cases (the same side-by-side run): 2 pods x 1 rank through the rendered `local` Job and the local
runner (`python -m k8s local`), the same job and the same node-level fault for every mechanism: `node` on
pod 1, `node` on pod 0, `drain` on pod 1. Mechanisms: kit+spare (SPARES=1), kit (no spare: the lost pod is
recreated at once by the local runner, the best case of the Kubernetes path, which on EKS adds scheduling,
image pull and a new node), torchrun and ft_launcher as the study deployed them (rendezvous on pod 0).
Reported: recovery (fault -> end of the first step after the resume), lost steps, and whether the job
survived (the Job completed); a baseline's lost job is reported as it is.

Last line: `RESULT kill_recovery_ratio=<kit / ft_launcher> inprocess_ratio=<kit-inproc / nvrx-wrapper>
hang_detect_steps=<kit hang detection / median step time> false_restarts=<restarts in the fault-free run>
node_recovery_ratio=<kit+spare node loss / kit single-rank kill> pod0_survived=<1|0> drain_lost_steps=<n>`.
Full mode writes docs/benchmarks/recovery.md; --quick (one repetition, the core cases) only prints.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from training.events import read_events
from training.metrics import RunMetrics, load_run_metrics

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "recovery.md"
JOB = [
    "--model.name", "tiny", "--data.seq_len", "64", "--data.batch_size", "2", "--optim.warmup_steps", "3",
    "--training.log_every", "50", "--checkpoint.mode", "async", "--checkpoint.interval", "5",
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

    @property
    def fault_step(self) -> int:
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
    """node or drain."""
    node: int

    @property
    def label(self) -> str:
        return f"{self.fault}@pod{self.node}"


NODE_STEPS = FAULT_STEP + 4
NODE_MECHANISMS = {"kit+spare": ["LAUNCHER=kit", "SPARES=1"], "kit": ["LAUNCHER=kit"],
                   "torchrun": ["LAUNCHER=torchrun"], "ft_launcher": ["LAUNCHER=ft_launcher"]}  # fmt: skip


@dataclass(kw_only=True)
class NodeOutcome:
    case: NodeCase
    returncode: int
    wall_s: float
    metrics: RunMetrics | None
    note: str = ""

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
        "MONITOR_INTERVAL_S=0.1", "MAX_RESTARTS=8",
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
    try:
        metrics = load_run_metrics(run_dir) if (run_dir / "events").exists() else None
    except ValueError as exc:
        metrics, tail = None, f"{tail}\nmetrics: {exc}"
    outcome = NodeOutcome(case=case, returncode=code, wall_s=wall, metrics=metrics)
    if code != 0:
        failed = [line for line in tail.splitlines() if "local job failed" in line or "timed out" in line]
        outcome.note = (failed or [f"exit {code}"])[-1].strip()
    return outcome


def node_plan(quick: bool, *, nvrx: bool) -> list[NodeCase]:
    kit = [NodeCase(mechanism=m, fault=f, node=n) for m in ("kit+spare", "kit") for f, n in
           (("node", 1), ("node", 0), ("drain", 1))]  # fmt: skip
    if quick:  # every spare case, and node loss without a spare
        kit = [c for c in kit if c.mechanism == "kit+spare" or (c.fault, c.node) == ("node", 1)]
    baselines = ("torchrun", "ft_launcher") if nvrx else ("torchrun",)
    faults = (("node", 0),) if quick else (("node", 1), ("node", 0), ("drain", 1))
    return kit + [NodeCase(mechanism=m, fault=f, node=n) for m in baselines for f, n in faults]


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    train = ["-m", "training.train", *trainer_args(case, root, run_id)]
    restarts = ["--max-restarts", "8"]
    if case.mechanism in ("kit", "kit-exec", "kit-inproc"):
        start = ["--worker-start", "exec"] if case.mechanism == "kit-exec" else []
        return [
            py, "-m", "training.launch", "--standalone", "--nproc-per-node", "2", *restarts, *start,
            "--heartbeat-load-timeout", "60", "--run-dir", str(run_dir), "--log-dir", str(logs), *train,
        ]  # fmt: skip
    endpoint = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", run_id]
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
        case=case, returncode=code, wall_s=wall, metrics=metrics, restarts=restarts, hang_detect_s=hang_detect
    )
    if code != 0:
        outcome.note = tail.strip().splitlines()[-1] if tail.strip() else f"exit {code}"
    return outcome


def recovery(o: Outcome) -> float | None:
    if o.metrics is None or not o.metrics.faults:
        return None
    return o.metrics.faults[0].recovery_s


def detection(o: Outcome) -> float | None:
    if o.metrics is None or not o.metrics.faults:
        return None
    return o.metrics.faults[0].detect_s


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def fmt(value: float | None, unit: str = " s") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def plan(quick: bool) -> tuple[list[Case], list[Case]]:
    """(single-fault cases, whole-run cases)."""
    single = [
        Case(mechanism="kit", fault="kill"),
        Case(mechanism="ft_launcher", fault="kill"),
        Case(mechanism="kit", fault="hang"),
        Case(mechanism="kit-inproc", fault="exception"),
        Case(mechanism="nvrx-wrapper", fault="exception"),
    ]
    if not quick:
        single += [
            Case(mechanism="torchrun", fault="kill"),
            Case(mechanism="kit-exec", fault="kill"),
            Case(mechanism="ft_launcher", fault="hang"),
            Case(mechanism="kit", fault="sigstop"),
            Case(mechanism="ft_launcher", fault="sigstop"),
            Case(mechanism="kit", fault="oom"),
            Case(mechanism="kit", fault="exception"),
        ]
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
    return single, whole


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of the core cases, no doc")
    parser.add_argument(
        "--reps", type=int, default=None, help="repetitions per single-fault case (default 3)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = parser.parse_args(argv)
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    if reps < 1:
        parser.error(f"--reps must be >= 1, got {reps}")
    single, whole = plan(args.quick)
    if shutil.which("ft_launcher", path=str(Path(sys.executable).parent)) is None:
        if not args.quick:
            print(
                "error: NVRx is not installed in this environment; run `make bench-setup` "
                "(nvidia-resiliency-ext==0.4.1 from requirements-bench.txt)",
                file=sys.stderr,
            )
            return 2
        print("note: NVRx is not installed: the ft_launcher and nvrx-wrapper cases are skipped", flush=True)
        single = [c for c in single if c.mechanism not in NVRX_MECHANISMS]
        whole = [c for c in whole if c.mechanism not in NVRX_MECHANISMS]
    nvrx = shutil.which("ft_launcher", path=str(Path(sys.executable).parent)) is not None
    nodes = node_plan(args.quick, nvrx=nvrx)
    workdir = Path(tempfile.mkdtemp(prefix="kit-bench-recovery-"))
    started = time.monotonic()
    results: dict[Case, list[Outcome]] = {}
    node_results: dict[NodeCase, NodeOutcome] = {}
    try:
        for rep in range(reps):
            for case in single:
                outcome = run_case(case, workdir, rep, timeout_s=240)
                results.setdefault(case, []).append(outcome)
                print(
                    f"{case.mechanism:13} {case.fault:9} rep {rep + 1}/{reps}: exit {outcome.returncode}, "
                    f"recovery {fmt(recovery(outcome))}, detection {fmt(detection(outcome))}"
                    + (f"  [{outcome.note}]" if outcome.note else ""),
                    flush=True,
                )
        for node_case in nodes:
            node_outcome = run_node_case(node_case, workdir / "nodes", timeout_s=240)
            node_results[node_case] = node_outcome
            f = (
                node_outcome.metrics.faults[0]
                if node_outcome.metrics and node_outcome.metrics.faults
                else None
            )
            print(
                f"{node_case.mechanism:13} {node_case.label:11}: exit {node_outcome.returncode}, "
                f"survived {int(node_outcome.survived)}, recovery {fmt(f.recovery_s if f else None)}, "
                f"lost {'-' if f is None or f.lost_steps is None else f.lost_steps}"
                + (f"  [{node_outcome.note}]" if node_outcome.note else ""),
                flush=True,
            )
        for case in whole:
            outcome = run_case(case, workdir, 0, timeout_s=600)
            results[case] = [outcome]
            m = outcome.metrics
            print(
                f"{case.mechanism:13} {case.fault:9} {case.total_steps} steps: exit {outcome.returncode}, "
                f"restarts {outcome.restarts}, goodput {fmt(m.goodput if m else None, '')}"
                + (f"  [{outcome.note}]" if outcome.note else ""),
                flush=True,
            )
    finally:
        if args.keep:
            print(f"run folders kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    table = render(results, reps=reps, quick=args.quick, elapsed_s=elapsed) + render_nodes(
        node_results, results
    )
    print(table)
    if not args.quick:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(table, encoding="utf-8")
        print(f"wrote {DOC.relative_to(REPO)}")
    print(result_line(results) + node_result_fields(node_results, results))
    return 0


def _single(results: dict[Case, list[Outcome]], mechanism: str, fault: str) -> list[Outcome]:
    return results.get(Case(mechanism=mechanism, fault=fault), [])


def result_line(results: dict[Case, list[Outcome]]) -> str:
    def ratio(a: float | None, b: float | None) -> str:
        return "nan" if a is None or b is None or b == 0 else f"{a / b:.2f}"

    kit_kill = median([recovery(o) for o in _single(results, "kit", "kill")])
    ft_kill = median([recovery(o) for o in _single(results, "ft_launcher", "kill")])
    kit_inproc = median([recovery(o) for o in _single(results, "kit-inproc", "exception")])
    wrapper = median([recovery(o) for o in _single(results, "nvrx-wrapper", "exception")])
    hangs = _single(results, "kit", "hang")
    detect = median([o.hang_detect_s for o in hangs])
    step = median([o.metrics.median_step_s if o.metrics else None for o in hangs])
    (free,) = [o for c, (o, *_) in results.items() if c.fault == "none"]
    return (
        f"RESULT kill_recovery_ratio={ratio(kit_kill, ft_kill)} inprocess_ratio={ratio(kit_inproc, wrapper)} "
        f"hang_detect_steps={ratio(detect, step)} false_restarts={free.restarts}"
    )


def _node_fault(o: NodeOutcome | None):  # type: ignore[no-untyped-def]
    return o.metrics.faults[0] if o is not None and o.metrics is not None and o.metrics.faults else None


def node_result_fields(nodes: dict[NodeCase, NodeOutcome], results: dict[Case, list[Outcome]]) -> str:
    """` node_recovery_ratio=... pod0_survived=... drain_lost_steps=...` for the RESULT line."""
    kill = median([recovery(o) for o in _single(results, "kit", "kill")])
    lost1 = _node_fault(nodes.get(NodeCase(mechanism="kit+spare", fault="node", node=1)))
    pod0 = nodes.get(NodeCase(mechanism="kit+spare", fault="node", node=0))
    drain = _node_fault(nodes.get(NodeCase(mechanism="kit+spare", fault="drain", node=1)))
    ratio = (
        "nan" if lost1 is None or lost1.recovery_s is None or not kill else f"{lost1.recovery_s / kill:.2f}"
    )
    drained = "nan" if drain is None or drain.lost_steps is None else str(drain.lost_steps)
    survived = "nan" if pod0 is None else str(int(pod0.survived))
    return f" node_recovery_ratio={ratio} pod0_survived={survived} drain_lost_steps={drained}"


def render_nodes(nodes: dict[NodeCase, NodeOutcome], results: dict[Case, list[Outcome]]) -> str:
    lines = [
        "",
        "## Node loss and drain: kit with and without a spare vs torchrun and ft_launcher",
        "",
        f"2 pods x 1 rank through `python -m k8s local` (tiny model, {NODE_STEPS} steps, checkpoints",
        f"every 5); the fault at the top of step {FAULT_STEP} on the named pod. kit = no spare (the local",
        "runner recreates the lost pod at once, the best case of the Kubernetes path); torchrun and",
        "ft_launcher keep their rendezvous on pod 0, as the study deployed them. Recovery = fault -> end of",
        "the first step after the resume; survived = the Job completed every step.",
        "",
        "| mechanism | fault | survived | recovery | took over | lost steps | wall | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, o in nodes.items():
        f = _node_fault(o)
        lost = "-" if f is None or f.lost_steps is None else str(f.lost_steps)
        lines.append(
            f"| {case.mechanism} | {case.label} | {'yes' if o.survived else 'no (job lost)'} | "
            f"{fmt(f.recovery_s if f else None)} | {(f.takeover if f else None) or '-'} | {lost} | "
            f"{o.wall_s:.1f} s | {o.note} |"
        )
    lines += ["", "```", (result_line(results) + node_result_fields(nodes, results)).strip(), "```", ""]
    return "\n".join(lines)


def render(results: dict[Case, list[Outcome]], *, reps: int, quick: bool, elapsed_s: float) -> str:
    mode = "--quick" if quick else f"--reps {reps}"
    lines = [
        "## Recovery: kit launcher and in-process restart vs NVRx and torchrun",
        "",
        f"Command: `python -m bench.recovery {mode}` ({elapsed_s / 60:.1f} min on this machine).",
        "Same job for every mechanism: tiny Llama, 2 ranks x 1 thread (gloo), async checkpoints every 5",
        f"steps; one fault on rank 1 at the top of step {FAULT_STEP} (hang, sigstop: step {HANG_STEP}), two",
        "steps after the last checkpoint. Recovery = fault -> end of the first step after the resume;",
        f"detection = fault -> the launcher's event (training.metrics). Median of {reps} run(s) each.",
        "",
        "| mechanism | fault | recovery (median) | runs | detection (median) | median step | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, outcomes in results.items():
        if case.fault in ("none", "schedule"):
            continue
        rec = [recovery(o) for o in outcomes]
        det = [o.hang_detect_s if case.fault in ("hang", "sigstop") else detection(o) for o in outcomes]
        steps = median([o.metrics.median_step_s if o.metrics else None for o in outcomes])
        notes = "; ".join(sorted({o.note for o in outcomes if o.note}))
        runs = ", ".join(fmt(r) for r in rec)
        lines.append(
            f"| {case.mechanism} | {case.fault} | {fmt(median(rec))} | {runs} | {fmt(median(det))} | "
            f"{fmt(steps)} | {notes} |"
        )
    lines += [
        "",
        "| run | steps | exit | restarts | wall | median step | strict goodput | training goodput | faults |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, (o,) in ((c, r) for c, r in results.items() if c.fault in ("none", "schedule")):
        m = o.metrics
        faults = len(m.faults) if m else 0
        lines.append(
            f"| {case.mechanism} {case.fault} | {case.total_steps} | {o.returncode} | {o.restarts} | "
            f"{o.wall_s:.1f} s | {fmt(m.median_step_s if m else None)} | "
            f"{fmt(m.goodput if m else None, '')} | {fmt(m.training_goodput if m else None, '')} | {faults} |"
        )
    lines += [
        "",
        "Mechanisms: kit = `python -m training.launch` (learned heartbeat timeout, warm zygote",
        "workers); kit-exec = the same without the zygote; ft_launcher = NVRx 0.4.1 (5 s heartbeat timeout);",
        "torchrun = `torch.distributed.run --max-restarts` (baseline); kit-inproc, nvrx-wrapper = in-process",
        f"restart (the kit's, NVRx inprocess.Wrapper) with a {COLLECTIVE_TIMEOUT_S} s gloo timeout. Strict",
        "goodput = steps in the result x median fault-free step / wall (training.metrics).",
        "",
        "```",
        result_line(results),
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
