"""`python -m fsdpkit.analysis.report RUN_DIR [--png PATH] [--json]`: a run's metrics as a table and a PNG
timeline.

The numbers come from `fsdpkit.analysis.metrics` (one module defines them); this module only presents them.
The timeline shows steps per rank over time, checkpoint stalls, faults, launcher detections and recoveries.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fsdpkit.analysis.metrics import (
    DETECTION_KINDS,
    FaultMetrics,
    MetricsError,
    RunMetrics,
    load_events,
    load_run_metrics,
    restore_source,
)
from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.cliargs import OneLineParser, output_file_problem, program
from fsdpkit.contracts.extras import MissingExtra, require

RESTORE_STYLE = {"memory": "gD", "peer": "bs", "shared": "mv"}
"""Timeline marker of a restore by its source (green diamonds, blue squares, purple triangles)."""
DEFAULT_PNG = "timeline.png"
"""Written inside the run folder unless --png says otherwise."""


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


ROWS: tuple[tuple[str, str, Any], ...] = (
    ("outcome", "finished, or why the run failed", lambda m: m.outcome),
    ("world size", "trainer ranks", lambda m: str(m.world_size)),
    ("world sizes", "ranks: seconds, steps (elastic)", lambda m: world_line(m)),
    ("wall time", "first trainer start to last end", lambda m: _s(m.wall_s)),
    ("steps completed", "steps in the final result", lambda m: str(m.steps_completed)),
    ("steps computed", "replays after resumes included", lambda m: str(m.steps_computed)),
    ("lost steps", "computed again after a resume", lambda m: str(m.lost_steps)),
    ("median step", "fault-free steps", lambda m: _s(m.median_step_s)),
    (
        "tokens/s per GPU",
        "median over steps",
        lambda m: "-" if m.tokens_per_s is None else f"{m.tokens_per_s:,.0f}",
    ),
    ("MFU", "model FLOPs / peak (GPU only)", lambda m: "-" if m.mfu is None else _pct(m.mfu)),
    ("checkpoint stall", "training loop blocked by saves", lambda m: _s(m.stall_s)),
    ("final drain", "last background save at exit", lambda m: _s(m.drain_s)),
    ("checkpoints", "committed / failed", lambda m: f"{m.checkpoints_committed} / {m.checkpoints_failed}"),
    ("efficiency", "1 - stalls / wall (study)", lambda m: _pct(m.efficiency)),
    ("faults", "recovered / injected", lambda m: f"{m.faults_recovered} / {len(m.faults)}" + _unfired(m)),
    ("restarts", "worker group / in-process", lambda m: f"{m.restarts} / {m.inprocess_restarts}"),
    ("restored from", "faults by where the state came from", lambda m: _restores(m)),
    ("recovery total", "sum over faults", lambda m: _s(m.recovery_s_total)),
    ("goodput", "steps x median step / wall (strict)", lambda m: _pct(m.goodput)),
    ("training goodput", "study's definition", lambda m: _pct(m.training_goodput)),
    ("infra goodput", "study's definition", lambda m: _pct(m.infra_goodput)),
)
"""Table rows: label, meaning, formatter. Shared by the single-run and the side-by-side tables."""


def world_line(m: RunMetrics) -> str:
    """'4: 5.0 s, 2 steps -> 3: 9.9 s, 6 steps -> 4: 11.3 s, 8 steps (2 reshards)'; '-' at one size."""
    if len({s.world_size for s in m.world_spans}) < 2:
        return "-"
    spans = " -> ".join(f"{s.world_size}: {s.duration_s:.1f} s, {s.steps} steps" for s in m.world_spans)
    return f"{spans} ({m.reshards} reshard{'s' * (m.reshards != 1)})"


def _restores(m: RunMetrics) -> str:
    """'memory 2 · peer 1' (the node's memory, another node's, shared storage, ...); '-' without faults."""
    return " · ".join(f"{source} {n}" for source, n in m.restores.items()) or "-"


def _unfired(m: RunMetrics) -> str:
    """What a planned fault that never fired adds to the faults cell: the run does not prove its recovery."""
    return f" ({len(m.faults_unfired)} planned never fired)" if m.faults_unfired else ""


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def straggler_lines(m: RunMetrics) -> list[str]:
    """The lost-time attribution of each straggler: which rank and node, and what share of the wall."""
    return [
        f"straggler: rank {s.rank} on node {s.node}, {_pct(_ratio(s.lost_s, m.wall_s))} of wall "
        f"({s.score:.2f}x slower than its peers from step ~{s.since_step}, confirmed at step {s.step}"
        + ("; its node was evicted for a spare)" if s.evicted else ")")
        for s in m.stragglers
    ]


def metrics_table(m: RunMetrics, title: str = "Run metrics") -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("meaning", style="dim")
    for label, meaning, fmt in ROWS:
        table.add_row(label, fmt(m), meaning)
    return table


def faults_table(m: RunMetrics) -> Table:
    table = Table(title="Faults")
    for col in (
        "#",
        "kind",
        "step",
        "target",
        "detected by",
        "blamed",
        "detect",
        "recovery",
        "downtime",
        "resumed",
        "restore",
        "lost",
        "took over",
    ):
        table.add_column(
            col,
            justify="right" if col not in ("kind", "detected by") else "left",
            no_wrap=col == "resumed",  # "12 (memory)": the step and where it came from stay on one line
        )
    for i, f in enumerate(m.faults, 1):
        resumed = "-" if f.resume_source is None else f"{f.resume_step} ({f.resume_source})"
        table.add_row(
            str(i),
            f.kind,
            str(f.step),
            f"node {f.node}" if f.node is not None else f"rank {f.rank}",
            f.detected_by or "-",
            "-" if f.blamed_rank is None else str(f.blamed_rank),
            _s(f.detect_s),
            _s(f.recovery_s),
            _s(f.downtime_s),
            resumed,
            _s(f.restore_s),
            "-" if f.lost_steps is None else str(f.lost_steps),
            f.takeover or "-",
        )
    return table


def comparison_table(
    runs: Mapping[str, RunMetrics], title: str = "Side by side", *, rows: Sequence[str] | None = None
) -> Table:
    """The same rows for several runs, one column each (the demo's kit / sync / torchrun view); `rows`
    picks labels of ROWS (and "mean recovery"), in their order; all by default."""
    table = Table(title=title)
    table.add_column("metric")
    for name in runs:
        table.add_column(name, justify="right")
    for label, _, fmt in ROWS:
        if rows is None or label in rows:
            table.add_row(label, *(fmt(m) for m in runs.values()))
    if rows is None or "mean recovery" in rows:
        table.add_row("mean recovery", *(_s(_mean_recovery(m)) for m in runs.values()))
    return table


DETECTED_BY = {
    "worker_failed": "its exit",
    "hang_detected": "the heartbeat",
    "peer_gone": "its rendezvous beat",
    "inprocess": "the trainer",
}
"""How each detection reads in a fault's line."""


NODE_FAULTS = {"node": "lost", "freeze": "frozen (silent)", "drain": "drained"}
"""How a node-level fault reads in a fault's line."""


def fault_line(f: FaultMetrics) -> str:
    """One fault in one line: what, where, detected after, recovered after (and from where)."""
    if f.node is not None:
        said = f"node {f.node} {NODE_FAULTS.get(f.kind, f.kind)} at step {f.step}: "
    else:
        said = f"{f.kind} on rank {f.rank} at step {f.step}: "
    if f.detect_s is None:
        said += "no detection recorded" if f.recovery_s is not None else "not detected"
    else:
        said += f"detected after {f.detect_s:.2f} s by {DETECTED_BY.get(f.detected_by or '', f.detected_by)}"
    if f.recovery_s is None:
        return said + ", never recovered"
    said += f", recovered after {f.recovery_s:.2f} s"
    more = [f"from {f.resume_source}"] if f.resume_source else []
    if f.lost_steps:
        more.append(f"{f.lost_steps} step(s) again")
    if f.takeover and f.takeover != "same nodes":
        more.append(f"{f.takeover} took over")
    return said + (f" ({', '.join(more)})" if more else "")


def _mean_recovery(m: RunMetrics) -> float | None:
    done = [f.recovery_s for f in m.faults if f.recovery_s is not None]
    return sum(done) / len(done) if done else None


def write_timeline(events: Sequence[Mapping[str, Any]], m: RunMetrics, png: Path, *, title: str = "") -> Path:
    """Steps per rank over time with stalls, faults, detections and recoveries, as a PNG (matplotlib Agg)."""
    matplotlib = require("matplotlib", extra="report", needed_by="the report's timeline")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trainer = [e for e in events if e.get("role") == "trainer" and e.get("rank") is not None]
    t0 = min(float(e["ts"]) for e in trainer)
    fig, (ax, ax_dur) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(3, 1.3))
    per_rank = _plot_steps(ax, ax_dur, trainer, t0)
    ref = min(int(e["rank"]) for e in trainer)
    _plot_stalls(ax, ax_dur, trainer, t0, ref)
    _plot_faults(ax, ax_dur, m, t0)
    detections = [
        float(e["ts"]) - t0 for e in events if e.get("role") == "launcher" and e["kind"] in DETECTION_KINDS
    ]
    if detections:
        ax.plot(detections, [0] * len(detections), "kx", ms=7, label="launcher detection", clip_on=False)
    _plot_restarts(ax, trainer, t0, ref)
    ax.set_xlim(left=0)
    ax.set_ylabel("step")
    ax.set_title(title or _timeline_title(m), fontsize=10)
    _plot_stragglers(ax, ax_dur, trainer, t0)
    _plot_world(ax_dur, m)
    ax.legend(loc="upper left", fontsize=8)
    ax_dur.set_ylabel("compute per rank (s)" if per_rank else "step time (s)")
    ax_dur.set_xlabel("seconds since the first trainer start")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _timeline_title(m: RunMetrics) -> str:
    return (
        f"goodput {_pct(m.goodput)} · efficiency {_pct(m.efficiency)} · "
        f"{m.faults_recovered}/{len(m.faults)} faults recovered"
        + (f" · {m.tokens_per_s:,.0f} tokens/s per GPU" if m.tokens_per_s is not None else "")
        + (f" · MFU {_pct(m.mfu)}" if m.mfu is not None else "")
    )


def _plot_steps(ax: Any, ax_dur: Any, trainer: Sequence[Mapping[str, Any]], t0: float) -> bool:
    """Each rank's steps over time (upper panel) and its step or compute times (lower panel); True when the
    lower panel shows compute per rank."""
    import matplotlib.pyplot as plt

    # One line per (rank, attempt, process) so a restart shows as a break and a drop back to the resumed step
    # (a replacement node's launcher counts its attempts from 0 again: its process is another line).
    series: dict[tuple[int, int, Any], list[tuple[float, int, float, float]]] = defaultdict(list)
    for e in trainer:
        if e["kind"] == "step":
            compute = e.get("compute_s")
            series[(int(e["rank"]), int(e.get("attempt") or 0), e.get("pid"))].append(
                (
                    float(e["ts"]) - t0,
                    int(e["step"]),
                    float(e.get("duration_s") or 0.0),
                    float(compute) if isinstance(compute, int | float) else math.nan,
                )
            )
    # The lower panel: each rank's own compute when the steps carry it (a straggler stands out; its step
    # time is everyone's), else the step times.
    per_rank = any(not math.isnan(pt[3]) for pts in series.values() for pt in pts)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labelled: set[int] = set()
    for (rank, _attempt, _pid), pts in sorted(series.items(), key=lambda kv: kv[0][:2]):
        color = colors[rank % len(colors)]
        label = None if rank in labelled else f"rank {rank}"
        labelled.add(rank)
        xs, steps, durs, computes = zip(*pts, strict=True)
        ax.plot(xs, steps, ".-", ms=3, lw=1, color=color, label=label)
        ax_dur.plot(xs, computes if per_rank else durs, ".-" if per_rank else ".", ms=3, lw=0.8, color=color)
    return per_rank


def _plot_stalls(ax: Any, ax_dur: Any, trainer: Sequence[Mapping[str, Any]], t0: float, ref: int) -> None:
    """The reference rank's checkpoint stalls, shaded on both panels."""
    stalled = False
    for e in trainer:
        if e["kind"] == "ckpt" and e.get("phase") == "stall" and int(e["rank"]) == ref:
            begin, dur = float(e["ts"]) - t0, float(e.get("duration_s") or 0.0)  # ckpt ts: the phase start
            for a in (ax, ax_dur):
                a.axvspan(
                    begin,
                    begin + dur,
                    color="orange",
                    alpha=0.35,
                    lw=0,
                    label=None if stalled else "ckpt stall",
                )
                stalled = True


def _plot_faults(ax: Any, ax_dur: Any, m: RunMetrics, t0: float) -> None:
    """Each fault as a red line with its kind and target, and its recovery shaded."""
    for i, f in enumerate(m.faults):
        x = f.ts - t0
        for a in (ax, ax_dur):
            a.axvline(x, color="red", lw=1.2, label="fault" if (i == 0 and a is ax) else None)
        ax.annotate(
            f"{f.kind}@{f.step} " + (f"n{f.node}" if f.node is not None else f"r{f.rank}"),
            (x, 0.98),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="red",
        )
        if f.recovery_s is not None:
            ax.axvspan(
                x, x + f.recovery_s, color="red", alpha=0.12, lw=0, label="recovery" if i == 0 else None
            )


def _plot_restarts(ax: Any, trainer: Sequence[Mapping[str, Any]], t0: float, ref: int) -> None:
    """Where each of the reference rank's restores found the state, and when workers started."""
    for source, style in RESTORE_STYLE.items():
        xs = [
            float(e["ts"]) - t0
            for e in trainer
            if e["kind"] == "resume" and int(e["rank"]) == ref and restore_source([e.get("source")]) == source
        ]
        if xs:
            ax.plot(xs, [0] * len(xs), style, ms=7, label=f"restore: {source}", clip_on=False)
    starts = sorted({round(float(e["ts"]) - t0, 3) for e in trainer if e["kind"] == "start"})
    ax.plot(starts, [0] * len(starts), "g^", ms=6, label="workers start", clip_on=False)


def _plot_stragglers(ax: Any, ax_dur: Any, trainer: Sequence[Mapping[str, Any]], t0: float) -> None:
    """Each straggler verdict as a dashed purple line with its rank and score."""
    for i, s in enumerate(e for e in trainer if e["kind"] == "straggler"):
        x = float(s["ts"]) - t0
        for a in (ax, ax_dur):
            a.axvline(
                x, color="purple", lw=1.2, ls="--", label="straggler found" if (i == 0 and a is ax) else None
            )
        ax.annotate(
            f"straggler r{s.get('target_rank')} {float(s.get('score') or 0):.1f}x",
            (x, 0.5), xycoords=("data", "axes fraction"), rotation=90, va="center", ha="right", fontsize=7,
            color="purple",
        )  # fmt: skip


def _plot_world(ax: Any, m: RunMetrics) -> None:
    """The world size over time on the lower panel's right axis, when the run changed it (elastic)."""
    if len({s.world_size for s in m.world_spans}) < 2:
        return
    xs = [x for s in m.world_spans for x in (s.start_s, s.start_s + s.duration_s)]
    ys = [s.world_size for s in m.world_spans for _ in (0, 1)]
    twin = ax.twinx()
    twin.plot(xs, ys, "-", color="gray", lw=1.5, drawstyle="steps-post", label="ranks")
    twin.set_ylabel("ranks", color="gray")
    twin.set_ylim(0, max(ys) + 1)


def _as_json(m: RunMetrics, png: Path | None) -> str:
    data = dataclasses.asdict(m)
    data["timeline_png"] = None if png is None else str(png)
    return json.dumps(data, indent=2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog=program("python -m fsdpkit.analysis.report"), description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder: <run.root>/<run.id>")
    parser.add_argument(
        "--png", type=Path, help=f"where to write the timeline (default RUN_DIR/{DEFAULT_PNG})"
    )
    parser.add_argument("--no-png", action="store_true", help="skip the timeline")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON instead of tables")
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir)
    if args.png is not None and not args.no_png and (problem := output_file_problem(args.png, "--png")):
        print(f"error: {problem}", file=sys.stderr)
        return exitcodes.USAGE
    no_timeline = None
    try:
        m = load_run_metrics(run_dir)
        png = None
        if not args.no_png:
            try:
                png = write_timeline(load_events(run_dir), m, args.png or run_dir / DEFAULT_PNG)
            except MissingExtra as exc:  # a core install: the tables without the picture
                no_timeline = f"no timeline: {exc}"
    except MetricsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except OSError as exc:
        where = f"--png={str(args.png)!r}" if args.png else f"RUN_DIR={str(run_dir)!r}"
        print(
            f"error: {where}: cannot write the timeline ({exc.strerror or exc}); pass --png PATH",
            file=sys.stderr,
        )
        return exitcodes.USAGE

    if args.json:
        print(_as_json(m, png))
        return exitcodes.OK
    console = Console(width=None if sys.stdout.isatty() else 132)
    console.print(metrics_table(m, title=f"Run metrics: {run_dir}"))
    if m.faults:
        console.print(faults_table(m))
    for fault in m.faults_unfired:
        console.print(f"warning: planned fault {fault} never fired: this run does not prove its recovery")
    for line in straggler_lines(m):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if png is not None:
        console.print(f"timeline: {png}")
    elif no_timeline is not None:
        console.print(no_timeline, markup=False, highlight=False)
    return exitcodes.OK


def entry() -> None:
    """The `kit-report` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
