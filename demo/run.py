"""`python -m demo [--quick]`: what the kit is for, on a laptop with no AWS account and no GPU.

1. Synthesizes the CloudFormation stacks offline (`cdk synth -q`), and says how long it took.
2. Renders the `local` Kubernetes Job (the same templates as EKS) and validates it against the schemas.
3. Runs it on CPU through the local runner: two "pods", the kit's heartbeat launcher, async checkpoints,
   in-process restart, and a short fault schedule (a kill, an exception, a hang, and a straggler: rank 0
   computing 3x slower from a step on, which the ranks find and name with its node, policy `report`).
4. Prints the goodput report and writes the PNG timeline.
5. Runs the same job without faults (the reference), with synchronous checkpoints, then as the study's
   baseline (plain `torchrun`, restarts left to the Job, synchronous checkpoints), and prints them side by
   side.
5b. Loses a whole node, pod 0 included (the one that hosts torchrun's rendezvous): the same job on 2 pods x 1
   rank, `node:step=N:node=0` (every process of pod 0 SIGKILLed at once), once with the kit and one hot spare,
   once with the torchrun baseline. torchrun's rendezvous lives on pod 0, so losing it ends every torchrun
   launcher: the job goes on only because the Job controller recreates every pod (a whole-job restart; on
   EKS scheduling, image pull and maybe a new node, the study's 270 s per fault). The local runner recreates
   them at once: the best case of that path.
6. Checks the guarantee on what is persisted: each run's final checkpoint, verified and loaded back from
   disk, must equal the fault-free run's value by value (model, optimizer, scheduler, data position, RNG;
   `fsdpkit.resilience.checkpoint.compare`). The demo exits 1 when a run of the kit's launcher (node loss
   included)
   differs or has no final checkpoint; the baselines are shown as they are.

`--quick` (the test suite's form) skips the synth, trains fewer steps, and runs only the kit's faulted run
and the fault-free reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fsdpkit.analysis.metrics import MetricsError, RunMetrics, load_run_metrics
from fsdpkit.analysis.report import comparison_table, fault_line, straggler_lines, write_timeline
from fsdpkit.contracts.cliargs import output_file_problem, output_folder_problem
from fsdpkit.resilience.checkpoint.compare import compare_checkpoints, final_checkpoint
from fsdpkit.resilience.checkpoint.resume import CheckpointError
from fsdpkit.runtime.events import read_events

if TYPE_CHECKING:
    from fsdpkit.k8s.local import PodRecord

REPO = Path(__file__).resolve().parents[1]
MARKER = ".kit-demo"
"""A file the demo puts in its work folder; only a folder holding it is ever wiped by a later demo."""
STEP_LINE = re.compile(r"\bstep (\d+)/(\d+)\b")
COMPARED_ROWS = (
    "wall time", "lost steps", "checkpoint stall", "efficiency", "faults", "restarts", "recovery total",
    "mean recovery", "goodput",
)  # fmt: skip
"""The side-by-side table's rows (the whole report of one run: `make report RUN_DIR=...`)."""


class DemoError(RuntimeError):
    """A step of the demo that cannot go on; one line that says what to do."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """The job every variant runs: same model, data, seed, steps and faults."""

    steps: int
    """Training steps of every run."""
    interval: int
    """Checkpoint interval in steps."""
    faults: str
    """Fault spec (contract 5); the hang comes last so the baseline's other recoveries are visible. The
    `slow` fault comes after the last worker restart before it (a restart clears the straggler detector's
    warm-up, and the straggler itself) and leaves the report `straggler_every` x 2 steps to confirm it."""
    nodes: int = 1
    """Pods (one per "node"); each runs its own launcher, and a restart on one brings both back."""
    procs_per_node: int = 2
    """Trainer ranks per pod."""
    seq_len: int = 32
    batch_size: int = 2
    heartbeat_timeout: str = "auto"
    """The kit launcher learns its hang timeout from the observed step times."""
    run_timeout_s: float = 240.0
    """Wall-clock cap of one kit run, seconds (a guard, never reached when the kit works)."""
    baseline_timeout_s: float = 75.0
    """Cap of the torchrun baseline: torchrun cannot see a hang; it waits for the collective timeout."""
    node_loss_step: int = 14
    """Step at which the node-loss variants lose pod 0 (after a checkpoint, so one step is recomputed)."""
    straggler_every: int = 2
    """Steps between the ranks' compute reports (TRAIN.straggler.every; the trainer's default 4 would not
    fit the warm-up and the confirmation in so short a run)."""
    straggler_warmup: int = 3
    """Reports that learn the job's own spread before a straggler can be named (TRAIN.straggler.warmup)."""


FULL = Scenario(
    steps=36,
    interval=6,
    faults="kill:step=10:rank=1,slow:step=13:rank=0:factor=3,exception:step=19:rank=1,hang:step=28:rank=1",
)
QUICK = Scenario(
    steps=26,
    interval=4,
    faults="kill:step=6:rank=1,exception:step=12:rank=1,slow:step=15:rank=0:factor=3,hang:step=23:rank=1",
)
"""The hang comes after 20 measured steps: until then the launcher's learned timeout is not armed."""


@dataclass(frozen=True, kw_only=True)
class Variant:
    key: str
    """Folder and run-id suffix."""
    title: str
    """Column title in the side-by-side table."""
    launcher: Literal["kit", "torchrun"]
    checkpoint_mode: Literal["async", "sync"]
    inprocess: bool
    faults: bool = True
    baseline: bool = False
    final_save_only: bool = False
    """Save only the final step (the reference: the same job, the cheapest way to its final checkpoint)."""
    node_loss: bool = False
    """Run on 2 pods x 1 rank and lose pod 0 at Scenario.node_loss_step instead of the rank faults."""
    spares: int = 0
    """Hot spare pods beside the training pods (kit launcher only)."""


KIT = Variant(
    key="kit", title="kit (async + heartbeat)", launcher="kit", checkpoint_mode="async", inprocess=True
)
SYNC = Variant(key="sync", title="sync checkpoints", launcher="kit", checkpoint_mode="sync", inprocess=True)
TORCHRUN = Variant(
    key="torchrun",
    title="torchrun baseline",
    launcher="torchrun",
    checkpoint_mode="sync",
    inprocess=False,
    baseline=True,
)
KIT_NODE = Variant(
    key="kit-node",
    title="kit, node 0 lost, 1 spare",
    launcher="kit",
    checkpoint_mode="async",
    inprocess=True,
    node_loss=True,
    spares=1,
)
TORCHRUN_NODE = Variant(
    key="torchrun-node",
    title="torchrun, node 0 lost",
    launcher="torchrun",
    checkpoint_mode="sync",
    inprocess=False,
    baseline=True,
    node_loss=True,
)
FAULT_FREE = Variant(
    key="reference",
    title="fault-free",
    launcher="kit",
    checkpoint_mode="sync",
    inprocess=False,
    faults=False,
    final_save_only=True,
)


@dataclass(kw_only=True)
class Outcome:
    variant: Variant
    succeeded: bool
    reason: str
    wall_s: float
    run_dir: Path
    metrics: RunMetrics | None = None
    timeline: Path | None = None
    same_final_as: dict[str, bool] = dataclasses.field(default_factory=dict)
    compare_note: str = ""
    """What the comparison with the reference found (or why there was none)."""
    pods: list[PodRecord] = dataclasses.field(default_factory=list)
    """Every pod the local runner started, replacements included, with its exit code."""


def _first_pods(pods: Sequence[PodRecord]) -> list[PodRecord]:
    """The pod each index started with (the rendezvous store's pod, index -1, left out)."""
    return [p for p in pods if p.attempt == 0 and p.index >= 0]


def ended_launchers(pods: Sequence[PodRecord]) -> list[PodRecord]:
    """The first pods that ended before the job did (non-zero exit): their launcher was lost or gave up,
    and only a replacement pod from the Job could go on in their place."""
    return [p for p in _first_pods(pods) if p.exit_code not in (None, 0)]


def whole_job_restart(pods: Sequence[PodRecord]) -> bool:
    """Every index's first pod ended with an error and was recreated: the job survived only as a new job."""
    first = _first_pods(pods)
    recreated = {p.index for p in pods if p.attempt > 0}
    return bool(first) and len(ended_launchers(pods)) == len(first) and recreated >= {p.index for p in first}


def _prepare_workdir(workdir: Path) -> None:
    """A fresh demo folder; an existing one is replaced only if an earlier demo made it."""
    if workdir.exists():
        if not (workdir / MARKER).exists():
            raise DemoError(f"{workdir} exists and was not made by the demo: pass --workdir NEW_FOLDER")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text(
        "made by `python -m demo`; removed by the next demo run\n", encoding="utf-8"
    )


def synth(workdir: Path, console: Console) -> float:
    """`cdk synth -q` offline into the demo folder; returns the seconds it took."""
    cdk = REPO / "node_modules" / ".bin" / "cdk"
    if not cdk.exists():
        raise DemoError("the CDK CLI is missing (node_modules/.bin/cdk): run `make setup` first")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
    }
    out = workdir / "cdk.out"
    t0 = time.monotonic()
    with console.status("synthesizing the stacks offline (cdk synth -q)"):
        proc = subprocess.run(
            [str(cdk), "synth", "-q", "--output", str(out)], cwd=REPO, env=env, capture_output=True, text=True
        )
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DemoError(f"cdk synth failed (exit {proc.returncode}): {last[0]}")
    templates = sorted(p.name for p in out.glob("*.template.json"))
    console.print(
        f"[green]✓[/] synthesized {len(templates)} stacks in {seconds:.1f} s: {', '.join(templates)}"
    )
    return seconds


def build_manifests(variant: Variant, scenario: Scenario) -> list[Any]:
    """Values -> validated manifests of the `local` profile (the same templates as on EKS)."""
    from fsdpkit.k8s.render import render
    from fsdpkit.k8s.validate import validate
    from fsdpkit.k8s.values import build_values

    nodes, procs = (2, 1) if variant.node_loss else (scenario.nodes, scenario.procs_per_node)
    faults = f"node:step={scenario.node_loss_step}:node=0" if variant.node_loss else scenario.faults
    overrides = [
        "PROFILE=local",
        f"RUN_ID=demo-{variant.key}",
        f"NODES={nodes}",
        f"PROCS_PER_NODE={procs}",
        "MODEL=tiny",
        f"STEPS={scenario.steps}",
        "LOG_EVERY=1",
        f"SEQ_LEN={scenario.seq_len}",
        f"BATCH_SIZE={scenario.batch_size}",
        f"CHECKPOINT_MODE={variant.checkpoint_mode}",
        f"CHECKPOINT_INTERVAL={scenario.steps if variant.final_save_only else scenario.interval}",
        f"FAULT_SPEC={faults if variant.faults else ''}",
        f"INPROCESS={'true' if variant.inprocess else 'false'}",
        f"LAUNCHER={variant.launcher}",
        "STRAGGLER_POLICY=report",
        f"TRAIN.straggler.every={scenario.straggler_every}",
        f"TRAIN.straggler.warmup={scenario.straggler_warmup}",
    ]
    if variant.launcher == "kit":
        overrides.append(f"HEARTBEAT_TIMEOUT={scenario.heartbeat_timeout}")
    if variant.spares:
        overrides.append(f"SPARES={variant.spares}")
    values = build_values(overrides=overrides)
    manifests = render(values)
    validate(manifests, versions=[values.kubernetes_version])
    return manifests


def run_variant(variant: Variant, scenario: Scenario, workdir: Path, console: Console) -> Outcome:
    """Run one variant through the local runner with a progress bar; metrics from its events."""
    from fsdpkit.k8s.local import run_local

    manifests = build_manifests(variant, scenario)
    timeout = scenario.baseline_timeout_s if variant.baseline else scenario.run_timeout_s
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # a log file gets the run's one line, not a bar's last frame
    )
    task = progress.add_task(variant.title, total=scenario.steps)

    def on_line(line: str) -> None:  # the pods' own lines (tracebacks of killed ranks too) stay in their logs
        if m := STEP_LINE.search(line):
            progress.update(task, completed=int(m.group(1)))

    t0 = time.monotonic()
    with progress:
        result = run_local(manifests, workdir=workdir / variant.key, timeout_s=timeout, on_line=on_line)
        if result.succeeded:  # the bar follows pod 0's log; after a node loss another pod trained on
            progress.update(task, completed=scenario.steps)
    outcome = Outcome(
        variant=variant,
        succeeded=result.succeeded,
        reason=result.reason,
        wall_s=time.monotonic() - t0,
        run_dir=Path(result.run_dir),
        pods=list(result.pods),
    )
    if variant.baseline and not result.succeeded and result.reason.startswith("timed out"):
        outcome.reason = f"stopped by the demo after {timeout:g} s (the baseline's cap)"
    elif variant.node_loss and result.succeeded and whole_job_restart(outcome.pods):
        outcome.reason = (
            f"finished only as a new job: every launcher ended, the Job recreated all "
            f"{len(_first_pods(outcome.pods))} pods"
        )
    try:
        outcome.metrics = load_run_metrics(outcome.run_dir)
        outcome.timeline = write_timeline(
            read_events(outcome.run_dir),
            outcome.metrics,
            outcome.run_dir / "timeline.png",
            title=variant.title,
        )
    except MetricsError as exc:
        outcome.reason += f"; no metrics: {exc}"
    mark = "[green]✓[/]" if outcome.succeeded else "[red]✗[/]"
    console.print(f"{mark} {variant.title}: {outcome.reason} ({outcome.wall_s:.0f} s)")
    for fault in outcome.metrics.faults if outcome.metrics is not None else []:
        console.print(f"    {fault_line(fault)}", highlight=False)
    for line in straggler_lines(outcome.metrics) if outcome.metrics is not None else []:
        console.print(f"    {line}", highlight=False)
    return outcome


def compare_with_reference(outcome: Outcome, reference: Outcome) -> None:
    """Compare the run's persisted final checkpoint with the reference's, loaded back from disk."""
    if outcome is reference:
        return
    try:
        mine, ref = final_checkpoint(outcome.run_dir), final_checkpoint(reference.run_dir)
        if mine.name != ref.name:
            raise CheckpointError(f"final checkpoint is {mine.name}, the reference's {ref.name}")
        result = compare_checkpoints(mine, ref)
    except CheckpointError as exc:
        outcome.compare_note = str(exc)
        if outcome.succeeded or not outcome.variant.baseline:
            outcome.same_final_as[reference.variant.key] = False
        return
    outcome.same_final_as[reference.variant.key] = result.equal
    outcome.compare_note = result.summary()


def guarantee_holds(outcomes: Sequence[Outcome], reference: Outcome) -> bool:
    """Every run of the kit's launcher finished where the fault-free run ended (the guarantee is the kit's;
    the baselines' outcomes are shown as they are, a different final model included)."""
    if not reference.succeeded:
        return False
    key = reference.variant.key
    checked = [o for o in outcomes if o is not reference and not o.variant.baseline]
    return all(o.succeeded and o.same_final_as.get(key, False) for o in checked)


def takeaways(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per comparison the demo is about, computed from the runs' metrics."""
    by_key = {o.variant.key: o for o in outcomes if o.metrics is not None}
    lines = []
    kit = by_key.get(KIT.key)
    if kit is None or kit.metrics is None:
        return lines
    k = kit.metrics
    if (sync := by_key.get(SYNC.key)) is not None and sync.metrics is not None:
        s = sync.metrics
        lines.append(
            f"checkpoint stall: kit {k.stall_s:.2f} s vs sync {s.stall_s:.2f} s "
            f"(efficiency {100 * k.efficiency:.1f} % vs {100 * s.efficiency:.1f} %)"
        )
    if (base := by_key.get(TORCHRUN.key)) is not None and base.metrics is not None:
        b = base.metrics
        mean = {name: _mean([f.recovery_s for f in m.faults]) for name, m in (("kit", k), ("torchrun", b))}
        shown = {name: "-" if v is None else f"{v:.1f} s" for name, v in mean.items()}
        lines.append(
            f"faults recovered: kit {k.faults_recovered}/{len(k.faults)} vs torchrun baseline "
            f"{b.faults_recovered}/{len(b.faults)}; mean recovery {shown['kit']} vs {shown['torchrun']}"
        )
        for fault in k.faults_unfired:
            lines.append(f"kit: planned fault {fault} never fired: this demo does not prove its recovery")
        unseen = [f for f in b.faults if f.recovery_s is None]
        if unseen and not base.succeeded:
            lines.append(
                f"torchrun baseline: the {unseen[0].kind} at step {unseen[0].step} was never recovered "
                "(torchrun has no heartbeat; only the collective timeout could end it); the demo stopped it"
            )
    node = {key: by_key.get(key) for key in (KIT_NODE.key, TORCHRUN_NODE.key)}
    if (kn := node[KIT_NODE.key]) is not None and kn.metrics is not None and kn.metrics.faults:
        f = kn.metrics.faults[0]
        said = f"node 0 lost at step {f.step}: kit with a spare " + (
            f"recovered in {f.recovery_s:.1f} s ({f.takeover or 'same nodes'} took over, "
            f"{f.lost_steps} step(s) computed again)"
            if f.recovery_s is not None
            else "did not recover"
        )
        lines.append(said)
    base = node[TORCHRUN_NODE.key]
    if base is not None and base.metrics is not None and base.metrics.faults:
        lines.append(torchrun_node_loss_line(base, base.metrics.faults[0]))
    return lines


def torchrun_node_loss_line(base: Outcome, fault: Any) -> str:
    """What losing pod 0 did to torchrun, said as it is: its rendezvous lived there, so every launcher
    ended; the job went on only if the Job controller recreated every pod (a new job, from disk)."""
    ended = ended_launchers(base.pods)
    said = (
        f"torchrun, node 0 lost at step {fault.step}: its rendezvous lived on pod 0, so "
        f"{len(ended)} of {len(_first_pods(base.pods))} launchers ended"
    )
    if not (base.succeeded and whole_job_restart(base.pods)):
        return said + f"; the job was lost ({base.reason})"
    said += "; it went on only as a whole-job restart (the Job recreated every pod)"
    if fault.recovery_s is not None:
        said += f", training again after {fault.recovery_s:.1f} s"
    said += " here, where pods start at once; on EKS add scheduling and image pull (the study: 270 s)"
    if base.same_final_as and not all(base.same_final_as.values()):
        said += "; its final model differs (docs/runbook.md 'torchrun after losing pod 0')"
    return said


def _mean(values: Sequence[float | None]) -> float | None:
    done = [v for v in values if v is not None]
    return sum(done) / len(done) if done else None


def outcome_table(outcomes: Sequence[Outcome], reference: str) -> Table:
    table = Table(title="Job outcome")
    table.add_column("run")
    table.add_column("job")
    table.add_column("wall", justify="right")
    table.add_column(f"final model = {reference}")
    for o in outcomes:
        same = o.same_final_as.get(reference)
        table.add_row(
            o.variant.title,
            ("[green]" if o.succeeded else "[red]") + o.reason + "[/]",
            f"{o.wall_s:.0f} s",
            "-"
            if same is None
            else ("[green]equal[/]" if same else f"[red]DIFFERENT[/] {_short(o.compare_note)}"),
        )
    return table


def _short(note: str) -> str:
    """A comparison's verdict without its list of examples (the summary JSON keeps them)."""
    return note.split(", e.g.")[0]


def summary(outcomes: Sequence[Outcome], synth_s: float | None) -> dict[str, Any]:
    return {
        "synth_s": synth_s,
        "runs": {
            o.variant.key: {
                "title": o.variant.title,
                "succeeded": o.succeeded,
                "reason": o.reason,
                "wall_s": o.wall_s,
                "run_dir": str(o.run_dir),
                "timeline_png": None if o.timeline is None else str(o.timeline),
                "same_final_as": o.same_final_as,
                "compare_note": o.compare_note,
                "metrics": None if o.metrics is None else dataclasses.asdict(o.metrics),
            }
            for o in outcomes
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="reduced form for the tests (no synth, fewer steps)"
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "demo", help="default runs/demo")
    parser.add_argument("--no-synth", action="store_true", help="skip `cdk synth`")
    parser.add_argument("--summary-json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--nodes", type=int, choices=(1, 2), help="pods: 1 (default, 2 ranks) or 2 (1 rank each)"
    )
    args = parser.parse_args(argv)

    console = Console(width=None if sys.stdout.isatty() else 120)
    scenario = QUICK if args.quick else FULL
    if args.nodes is not None:
        scenario = dataclasses.replace(scenario, nodes=args.nodes, procs_per_node=2 // args.nodes)
    variants = (KIT, FAULT_FREE) if args.quick else (KIT, FAULT_FREE, SYNC, TORCHRUN, KIT_NODE, TORCHRUN_NODE)
    reference = FAULT_FREE.key
    t_start = time.monotonic()
    for problem in (
        output_folder_problem(args.workdir, "--workdir"),
        args.summary_json and output_file_problem(args.summary_json, "--summary-json"),
    ):
        if problem:  # checked before anything runs: a bad path must not cost a whole demo
            console.print(f"[red]error:[/] {problem}", highlight=False)
            return 1
    try:
        workdir = args.workdir.resolve()
        _prepare_workdir(workdir)
        synth_s = None if (args.quick or args.no_synth) else synth(workdir, console)
        console.print(
            f"job: {scenario.nodes} pod(s) x {scenario.procs_per_node} rank(s), model tiny, "
            f"{scenario.steps} steps, checkpoint every {scenario.interval}, faults {scenario.faults}"
        )
        outcomes = []
        for variant in variants:
            outcomes.append(run_variant(variant, scenario, workdir, console))
        ref = next(o for o in outcomes if o.variant.key == reference)
        for o in outcomes:
            compare_with_reference(o, ref)
    except DemoError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 1
    except ValueError as exc:  # values, manifests and local-runner errors are one-line ValueErrors
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 1

    console.print(outcome_table(outcomes, reference))
    for line in takeaways(outcomes):
        console.print(f"[bold]•[/] {line}", highlight=False)
    named = {o.variant.title: o.metrics for o in outcomes if o.metrics is not None}
    console.print(comparison_table(named, title="Side by side (same job, same faults)", rows=COMPARED_ROWS))
    console.print(
        f"demo finished in {time.monotonic() - t_start:.0f} s; logs, events and metrics of each run under "
        f"{workdir}; the whole report of a run: make report RUN=<its run folder>"
    )
    console.print(f"timeline: {outcomes[0].timeline}", soft_wrap=True, highlight=False)  # a path, unbroken
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary(outcomes, synth_s), indent=2), encoding="utf-8")
    kit = outcomes[0]
    if not guarantee_holds(outcomes, ref):
        console.print("[red]error:[/] a run did not end where the fault-free run ended (see the table)")
        return 1
    return 0 if kit.succeeded else 1
