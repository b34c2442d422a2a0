"""The recovery benchmark's markdown: the tables of docs/benchmarks/recovery.md, and the hand-written
notes kept below them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.recovery_cases import COLLECTIVE_TIMEOUT_S, FAULT_STEP, HANG_STEP, NODE_STEPS, PHASES, REPS
from bench.recovery_figures import (
    RATIO_KEYS,
    Figure,
    Results,
    detection,
    figure,
    fmt,
    median,
    node_fault,
    node_recovery,
    recovery,
    result_line,
)

NOTES_MARK = "<!-- notes below: written by hand, kept when bench.recovery rewrites this file -->"


def with_notes(table: str, doc: Path) -> str:
    """The new tables plus the hand-written reading notes of the old file (after NOTES_MARK)."""
    old = doc.read_text(encoding="utf-8") if doc.exists() else ""
    _, mark, notes = old.partition(NOTES_MARK)
    return table.rstrip() + "\n\n" + NOTES_MARK + notes if mark else table


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
        "detection = fault -> the launcher's event (fsdpkit.analysis.metrics). Repetitions interleaved",
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
        "Mechanisms: kit = `python -m fsdpkit.launcher` (learned heartbeat timeout, warm zygote",
        "workers); kit-exec = the same without the zygote; ft_launcher = NVRx 0.4.1 (5 s heartbeat timeout);",
        "torchrun = `torch.distributed.run --max-restarts` (baseline); kit-inproc, nvrx-wrapper = in-process",
        f"restart (the kit's, NVRx inprocess.Wrapper) with a {COLLECTIVE_TIMEOUT_S} s gloo timeout. Strict",
        "goodput = steps in the result x median fault-free step / wall (fsdpkit.analysis.metrics).",
    ]
    return "\n".join(lines + render_nodes(results) + render_figures(figs)) + "\n"


def render_nodes(results: Results) -> list[str]:
    lines = [
        "",
        "## Node loss and drain: kit with and without a spare vs torchrun and ft_launcher",
        "",
        f"2 pods x 1 rank through `python -m fsdpkit.k8s local` (tiny model, {NODE_STEPS} steps, checkpoints",
        f"every 5); the fault at the top of step {FAULT_STEP} on the named pod. kit = no spare (the local",
        "runner recreates the lost pod at once, the best case of the Kubernetes path); torchrun and",
        "ft_launcher keep their rendezvous on pod 0, as the study deployed them. Recovery = fault -> end of",
        "the first step after the resume; survived = the Job completed every step (runs that did / runs).",
        "",
        "| mechanism | fault | survived | recovery (median) | spread | n | took over | lost steps | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, outcomes in results.nodes.items():
        faults = [node_fault(o) for o in outcomes]
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
