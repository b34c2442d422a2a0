"""Recovery benchmark: the same tiny FSDP job and the same faults under every restart mechanism, in one run.

`python -m bench.recovery [--quick] [--reps N] [--json PATH]` runs the trainer (tiny model, 2 ranks x 1
thread, gloo, async checkpoints every 5 steps) with one injected fault per run, under:
  kit          python -m fsdpkit.launcher (heartbeats, learned timeout, warm zygote workers)
  kit-exec     the same launcher without the zygote (--worker-start exec), to show what the zygote buys
  ft_launcher  NVRx 0.4.1 ft_launcher (heartbeats through RankMonitorClient, 5 s heartbeat timeout)
  torchrun     torch.distributed.run --max-restarts (the baseline; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
  kit-inproc   the trainer's in-process restart (inprocess.backend=kit) under the kit launcher
  nvrx-wrapper the trainer inside NVRx inprocess.Wrapper (inprocess.backend=nvrx) under torchrun
Faults: kill (SIGKILL), hang (the training thread stops), sigstop, oom (self-imposed limit), exception; all on
rank 1 at a fixed step, once per run. Every figure comes from the run's events through
fsdpkit.analysis.metrics: recovery = fault -> end of the first step after the resume; detection = fault ->
the launcher's event. Plus a fault-free run of >= 200 steps with checkpoints under the kit launcher (false
restarts) and, in full mode, the study's seeded 5-fault schedule (exception 0.6 / hang 0.4) for strict
goodput per mechanism.

Node cases (the same side-by-side run): 2 pods x 1 rank through the rendered `local` Job and the local
runner (`python -m fsdpkit.k8s local`), in the single-fault cases' job shape, with a node-level fault:
kit+spare
(SPARES=1) gets `node` on pod 1, `node` on pod 0 and `drain` on pod 1; kit without a spare (the lost pod is
recreated at once by the local runner, the best case of the Kubernetes path, which on EKS adds scheduling,
image pull and a new node) `node` on pod 1; torchrun and ft_launcher as the study deployed them (rendezvous
on pod 0) `node` on pods 1 and 0 (full mode). With a spare the lost pod's replacement (the next spare)
starts SPARE_REPLACEMENT_AFTER_S after the loss, not on the cores the recovery runs on. Reported: recovery
(fault -> end of the first step after the resume), lost steps, whether the job survived (the Job
completed), and where the spare's recovery went (recovery_phases); a baseline's lost job is reported as it
is.

Repetitions (so that a figure holds still from run to run): each RESULT ratio's numerator and denominator run
--reps times (default 7, --quick 2) in this one run, interleaved (rep 1 of every case, then rep 2, ...) so
that a slow minute of the machine hits both; a ratio is the median of the per-repetition ratios, with its
min-max spread. The cases behind the doc's other claims run min(3, reps) times, the baselines' node cases
once.
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
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench import stability
from bench.recovery_cases import (
    FREE_STEPS,
    NVRX_MECHANISMS,
    REPO,
    REPS,
    Case,
    NodeCase,
    NodeOutcome,
    Outcome,
    release,
    run_case,
    run_node_case,
)
from bench.recovery_cases import PHASES as PHASES  # re-exported
from bench.recovery_cases import recovery_phases as recovery_phases  # re-exported
from bench.recovery_figures import (
    COUNT_KEYS,
    RESULT_KEYS,
    Figure,
    Results,
    detection,
    figures,
    fmt,
    node_fault,
    node_recovery,
    recovery,
    result_line,
)
from bench.recovery_figures import paired_ratio as paired_ratio  # re-exported
from bench.recovery_report import NOTES_MARK as NOTES_MARK  # re-exported
from bench.recovery_report import render, with_notes

DOC = REPO / "docs" / "benchmarks" / "recovery.md"


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
                f = node_fault(node)
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


if __name__ == "__main__":
    sys.exit(main())
