"""Goodput benchmark: the study's 5-fault schedule on the same tiny job under every mechanism, in one run.

`python -m bench.goodput [--quick] [--reps N]` trains the tiny model on 2 ranks (gloo, 1 thread each) for
2,000 steps with the study's seeded schedule (reference/seed-system.md §11: seed 42, 5 faults after step
10, kinds exception 0.6 / hang 0.4, never rank 0), side by side under:
  kit              the kit as deployed: heartbeat launcher (`python -m fsdpkit.launcher`), in-process restart
                   (exceptions recovered in process), async checkpoints at the kit's interval: `auto`
                   (Young/Daly from the measured save cost) given the schedule's MTBF, steps x ~0.2 s / 5
  kit@study        the same with the study's interval (500 steps)
  kit-sync         the same as kit with `--checkpoint.mode sync` (the kit's interval)
  ft_launcher      NVRx 0.4.1 ft_launcher (5 s heartbeat timeout), sync checkpoints every 500 steps
  torchrun         torch.distributed.run --max-restarts (the study's Kubernetes baseline: a hang is seen only
                   when the healthy rank's collective times out, 60 s as the study's NCCL timeout), sync
                   checkpoints every 500 steps
The launcher command lines are bench/recovery_cases.py's. Every figure comes from the run's events through
fsdpkit.analysis.metrics, over the job's wall time from this process's clock (launch to exit: start-up
counts).

--quick scales the run down by 10 (200 steps, interval and schedule window scaled alike, the same 5 faults;
torchrun's collective timeout 10 s), runs only the RESULT's mechanisms (kit, ft_launcher, torchrun: under 5
minutes on 2 cores, plus its calibration's ~5 minutes) and only prints. Last line:
`RESULT kit_goodput=<strict> vs_ft_launcher=<kit / ft_launcher> vs_torchrun=<kit / torchrun>
unfired=<planned faults that never fired, over those runs> plan_error=<max over those mechanisms of
|predicted - measured| strict goodput> plan_miss=<max distance of a measurement outside its predicted range,
0 inside> plan_spread=<widest predicted range> calibration=<run|file>`.

The plan's validation (does the plan predict what a run measures?): `make plan`'s model
(ops/plan/schedule.py), fed this job (its median step, its interval, the schedule's faults) and each
mechanism's per-phase costs, predicts each mechanism's strict goodput, and the range the calibration's
repetitions give each alone; the run prints both beside the measurement. The costs are measured in the same
run by default (`--calibration run`, `--calibration-reps` 2: half the repetitions before the runs predicted,
half after, on the same machine and load): a calibration from another machine of the same kind missed by
0.054 where its own machine's runs missed by 0.014-0.017, i.e. it fitted that machine's noise.
`--calibration file` uses ops/plan/calibration.json instead (the smoke run's default).
`--calibrate` measures those costs alone: each RESULT mechanism fault-free (60 steps) and with one exception
and one hang (bench/recovery_cases.py's fault steps), --reps times (default 3) interleaved, and rewrites that
file's section.
Full mode writes docs/benchmarks/goodput.md and the kit run's timeline, docs/benchmarks/goodput_timeline.png.
`--only kit,kit-sync` runs just those mechanisms (at either size) to look at them; it writes no doc.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.recovery_cases import HANG_STEP, NVRX_MECHANISMS, Case, Outcome, release, run_case
from fsdpkit.analysis.metrics import Goodput, RunMetrics, goodput_over, time_budget
from fsdpkit.analysis.report import write_timeline
from fsdpkit.ops.plan.calibration import (
    CalibrationError,
    GoodputPhases,
    MechanismPhases,
    goodput_phases,
    read_sections,
    write_section,
)
from fsdpkit.ops.plan.failures import PlanInputError
from fsdpkit.ops.plan.schedule import (
    RangedPrediction,
    RunRecord,
    ScheduledRun,
    calibrate,
    predict_range,
    spreads,
)
from fsdpkit.resilience.checkpoint.interval import INTERVAL_EVENT
from fsdpkit.resilience.faults import parse_kinds, seeded_schedule
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "goodput.md"
PNG = DOC.with_name("goodput_timeline.png")
STUDY_STEPS = 2000
STUDY_INTERVAL = 500
STUDY_AFTER_STEP = 10
STEP_S = 0.2
"""The tiny job's expected step time on 2 ranks here (seconds): sets the MTBF the kit's interval is given."""
KIT_INTERVAL_MIN = 10
"""The kit's fewest steps between saves at 2,000 steps (checkpoint.interval_min's default), scaled."""
BASELINE_TIMEOUT_S = 60.0
"""torchrun's collective timeout: the study's NCCL timeout, the time its baseline takes to see a hang."""


@dataclass(frozen=True, kw_only=True)
class Scale:
    """One size of the run; every step count of the study scaled by `steps / 2000`."""

    name: str
    steps: int
    baseline_timeout_s: float
    """torchrun's collective timeout (seconds)."""
    faults: int = 5
    kinds: str = "exception:0.6,hang:0.4"

    def scaled(self, study_steps: int) -> int:
        return max(1, round(study_steps * self.steps / STUDY_STEPS))


SCALES = {
    "full": Scale(name="full", steps=STUDY_STEPS, baseline_timeout_s=BASELINE_TIMEOUT_S),
    "quick": Scale(name="quick", steps=200, baseline_timeout_s=10.0),
    # the smoke test's: every process path, no hang (it needs 20 steps of learning before the kit sees one)
    "smoke": Scale(name="smoke", steps=20, baseline_timeout_s=10.0, faults=1, kinds="exception"),
}


@dataclass(frozen=True, kw_only=True)
class Mechanism:
    label: str
    base: str
    """bench/recovery_cases.py's mechanism whose command line this one uses."""
    mode: str
    """Checkpoint mode: async or sync."""
    study_interval: bool
    """True: the study's 500 steps (scaled); False: the kit's interval."""
    describe: str


MECHANISMS = (
    Mechanism(label="kit", base="kit-inproc", mode="async", study_interval=False,
              describe="heartbeat launcher, in-process restart, async checkpoints (writer in the idle "
                       "class), the kit's interval (auto, given the schedule's MTBF; the range it chose, and "
                       "its last choice)"),
    Mechanism(label="kit@study", base="kit-inproc", mode="async", study_interval=True,
              describe="the same with the study's interval"),
    Mechanism(label="kit-sync", base="kit-inproc", mode="sync", study_interval=False,
              describe="the kit with sync checkpoints at the kit's interval"),
    Mechanism(label="ft_launcher", base="ft_launcher", mode="sync", study_interval=True,
              describe="NVRx 0.4.1 ft_launcher (5 s heartbeat timeout), sync checkpoints, study's interval"),
    Mechanism(label="torchrun", base="torchrun", mode="sync", study_interval=True,
              describe="torch.distributed.run --max-restarts 8, sync checkpoints, the study's interval"),
)  # fmt: skip


RESULT_MECHANISMS = ("kit", "ft_launcher", "torchrun")
"""The mechanisms the RESULT line compares; --quick runs only these."""


def mtbf_s(scale: Scale) -> float:
    """The schedule's mean time between faults: the run's expected step time over its fault count."""
    return scale.steps * STEP_S / scale.faults


def interval_args(mech: Mechanism, scale: Scale) -> list[str]:
    """The study's interval (scaled), or the kit's: `auto` (Young/Daly) given the schedule's MTBF."""
    if mech.study_interval:
        return ["--checkpoint.interval", str(scale.scaled(STUDY_INTERVAL))]
    return ["--checkpoint.interval", "auto", "--checkpoint.mtbf_s", f"{mtbf_s(scale):g}",
            "--checkpoint.interval_min", str(scale.scaled(KIT_INTERVAL_MIN))]  # fmt: skip


SCHEDULE_SEED = 42
RANKS = 2
"""bench/recovery_cases.py's job: 2 ranks on one node."""


def mechanism_args(mech: Mechanism, scale: Scale) -> list[str]:
    """The trainer flags of a mechanism apart from its interval and faults."""
    args = ["--checkpoint.mode", mech.mode]
    if mech.mode == "async":  # a node that only trains: the writer on the CPU left (docs/checkpointing.md)
        args += ["--checkpoint.writer_priority", "idle"]
    if mech.base == "torchrun":
        args += ["--training.collective_timeout_s", f"{scale.baseline_timeout_s:g}"]
    return args


def case(mech: Mechanism, scale: Scale) -> Case:
    trainer = [
        "--fault.schedule_seed", str(SCHEDULE_SEED), "--fault.schedule_count", str(scale.faults),
        "--fault.schedule_kinds", scale.kinds,
        "--fault.schedule_after_step", str(scale.scaled(STUDY_AFTER_STEP)),
        *mechanism_args(mech, scale), *interval_args(mech, scale),
    ]  # fmt: skip
    return Case(mechanism=mech.base, fault="schedule", steps=scale.steps, trainer=tuple(trainer))


def planned_faults(scale: Scale) -> tuple[tuple[str, int], ...]:
    """(kind, step) of the schedule's faults, as the trainer draws them."""
    faults = seeded_schedule(
        seed=SCHEDULE_SEED, count=scale.faults, kinds=parse_kinds(scale.kinds),
        after_step=scale.scaled(STUDY_AFTER_STEP), max_steps=scale.steps, world_size=RANKS,
    )  # fmt: skip
    return tuple((f.kind, f.step) for f in faults if f.step is not None)


CALIBRATION_FAULTS = ("exception", "hang")
"""The schedule's kinds: one of each alone, at bench/recovery_cases.py's fault steps (two after a save)."""
CALIBRATION_STEPS = 60
CALIBRATION_INTERVAL = 5
CALIBRATION_REPS = 3
CALIBRATION_PHASE_S = 5.0
"""NVRx's rank monitor checks heartbeats every 5 s (workload_check_interval), so ft_launcher sees a hang 5 to
10 s after it, by where the hang falls in that period; a hang at a fixed step falls at the same place in
every run (measured: 11.5 s in 6 of 6 calibration runs, 7.3 s in a bench.goodput run). The repetitions'
hangs are spread evenly over the period, and a fault's cost is their mean: the expected cost."""


def calibration_case(mech: Mechanism, scale: Scale, fault: str, *, at_step: int | None = None) -> Case:
    """The mechanism as the schedule runs it, with a fixed interval and one fault (or none)."""
    trainer = (*mechanism_args(mech, scale), "--checkpoint.interval", str(CALIBRATION_INTERVAL))
    steps = CALIBRATION_STEPS if fault == "none" else 0
    return Case(mechanism=mech.base, fault=fault, steps=steps, trainer=trainer, at_step=at_step)


def hang_step(rep: int, reps: int, step_s: float) -> int:
    """Repetition `rep`'s hang: HANG_STEP plus its share of CALIBRATION_PHASE_S, in steps of `step_s`."""
    return HANG_STEP + round(rep * CALIBRATION_PHASE_S / reps / step_s)


def run_record(outcome: Outcome) -> RunRecord | None:
    """A finished run's figures for the calibration; None when it failed or left no events."""
    m = outcome.metrics
    if m is None or outcome.returncode != 0 or not m.finished:
        return None
    b = time_budget(m, outcome.wall_s)
    return RunRecord(
        wall_s=outcome.wall_s, step_s=m.median_step_s, steps=m.steps_completed, lost_steps=m.lost_steps,
        saves=m.checkpoints_committed, save_cost_s=b.checkpoint_s + b.slow_steps_s, downtime_s=b.downtime_s,
    )  # fmt: skip


Records = dict[str, dict[str, list[RunRecord]]]
"""Calibration runs by mechanism label, then fault kind ("none" for the fault-free runs)."""


def calibration_rep(
    mechanisms: Sequence[Mechanism], scale: Scale, workdir: Path, rep: int, reps: int, records: Records
) -> None:
    """Repetition `rep` of `reps`: each mechanism fault-free and with one fault of each kind, added to
    `records`."""
    for mech in mechanisms:
        step_s = STEP_S
        for fault in ("none", *CALIBRATION_FAULTS):
            at = hang_step(rep, reps, step_s) if fault == "hang" else None
            outcome = run_case(calibration_case(mech, scale, fault, at_step=at), workdir, rep, timeout_s=600)
            record = run_record(outcome)
            print(
                f"calibrate {mech.label:12} {fault:9} rep {rep + 1}/{reps}: exit {outcome.returncode}, "
                f"wall {outcome.wall_s:.1f} s"
                + (f", at step {at}" if at else "")
                + (f"  [{outcome.note}]" if outcome.note else ""),
                flush=True,
            )
            if record is not None:
                records.setdefault(mech.label, {}).setdefault(fault, []).append(record)
                step_s = record.step_s if fault == "none" else step_s  # this machine's step, now


def calibration_section(records: Records, scale: Scale, reps: int) -> dict:  # type: ignore[type-arg]
    """The section ops/plan/calibration.py reads (raises PlanInputError when a mechanism has too few
    finished runs)."""
    mechs: dict[str, object] = {}
    for label, by_fault in records.items():
        free = by_fault.get("none", [])
        phases = calibrate(free, {k: by_fault.get(k, []) for k in CALIBRATION_FAULTS})
        mechs[label] = dataclasses.asdict(phases) | {
            "runs": {k: [dataclasses.asdict(r) for r in v] for k, v in by_fault.items()}
        }
    return {"collective_timeout_s": scale.baseline_timeout_s, "reps": reps, "mechanisms": mechs}


def run_calibration(mechanisms: Sequence[Mechanism], scale: Scale, workdir: Path, reps: int) -> dict:  # type: ignore[type-arg]
    """Each mechanism fault-free and with one fault of each kind, `reps` times interleaved; the section
    ops/plan/calibration.py reads."""
    records: Records = {}
    for rep in range(reps):
        calibration_rep(mechanisms, scale, workdir, rep, reps, records)
    return calibration_section(records, scale, reps)


def predicted(
    run: Run, scale: Scale, phases: GoodputPhases | None, each: Sequence[MechanismPhases] = ()
) -> RangedPrediction | None:
    """What the plan's model, fed this job and its schedule, predicts for `run`, with the range the
    calibration's repetitions (`each`) give (None: not calibrated)."""
    m = run.metrics
    cal = None if phases is None else phases.mechanisms.get(run.mech.label)
    if m is None or cal is None:
        return None
    interval = scale.scaled(STUDY_INTERVAL) if run.mech.study_interval else None
    job = ScheduledRun(
        steps=scale.steps,
        step_s=m.median_step_s,
        # every interval and the final step (ceil); auto: the run's own choice
        saves=-(-scale.steps // interval) if interval else m.checkpoints_committed,
        interval=interval,
        faults=planned_faults(scale),
    )
    extra = None
    if (
        run.mech.base == "torchrun"
    ):  # its hang waits out the collective timeout, the calibration's or this one
        extra = {"hang": scale.baseline_timeout_s - phases.collective_timeout_s}  # type: ignore[union-attr]
    return predict_range(job, cal, each, fault_extra_s=extra)


BUDGET = ("wall_s", "useful_s", "replay_s", "slow_steps_s", "checkpoint_s", "downtime_s", "startup_s",
          "outside_s", "other_s")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Run:
    mech: Mechanism
    outcome: Outcome
    goodput: Goodput | None
    """Over the job's wall time (launch to exit); None when the run left no events."""
    intervals: tuple[int, ...] = ()
    """The intervals `auto` logged, in order (its `interval` events); empty for a fixed interval."""

    @property
    def metrics(self) -> RunMetrics | None:
        return self.outcome.metrics


def measure(mech: Mechanism, scale: Scale, workdir: Path, index: int, *, timeout_s: float) -> Run:
    outcome = run_case(case(mech, scale), workdir, index, timeout_s=timeout_s)
    m, folder = outcome.metrics, run_dir(workdir, mech, index)
    events = read_events(folder) if (folder / "events").exists() else []
    chosen = tuple(int(e["interval"]) for e in events if e["kind"] == INTERVAL_EVENT)
    return Run(
        mech=mech, outcome=outcome, goodput=goodput_over(m, outcome.wall_s) if m else None, intervals=chosen
    )


def interval_cell(mech: Mechanism, scale: Scale, runs: Sequence[Run]) -> str:
    """The study's fixed interval, or what `auto` chose: its range over the run and its last value."""
    if mech.study_interval:
        return str(scale.scaled(STUDY_INTERVAL))
    chosen = [f"{min(r.intervals)}-{max(r.intervals)}, last {r.intervals[-1]}" for r in runs if r.intervals]
    return f"auto: {'; '.join(chosen) or '?'}"


def run_dir(workdir: Path, mech: Mechanism, index: int) -> Path:
    """Where run_case put the run (its run id)."""
    return workdir / "runs" / f"{mech.base}-schedule-{index}".replace("_", "-")


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(present) if present else None


def _fmt(value: float | None, spec: str = ".3f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _spread(values: Sequence[float | None], spec: str = ".3f", unit: str = "") -> str:
    """Median, and min-max when there is more than one value."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    mid = _fmt(statistics.median(present), spec, unit)
    return mid if len(present) == 1 else f"{mid} ({present[0]:{spec}}-{present[-1]:{spec}})"


def strict(runs: Sequence[Run]) -> float | None:
    return _median([r.goodput.strict if r.goodput else None for r in runs])


@dataclass(frozen=True, kw_only=True)
class PlanCheck:
    """The plan's prediction of one mechanism's strict goodput beside the measurement (medians over runs)."""

    label: str
    measured: float
    predicted: float
    parts_s: dict[str, float]
    """The predicted wall time of the first run, split (ops/plan/schedule.py's parts)."""
    low: float
    high: float
    """The lowest and highest prediction over the calibration's repetitions (medians over runs)."""
    step_ratio: float = math.nan
    """The runs' median step over the calibration's: far from 1, the machine's load changed between them."""

    @property
    def error(self) -> float:
        return abs(self.predicted - self.measured)

    @property
    def miss(self) -> float:
        """How far the measurement lies outside the predicted range (0 inside it)."""
        return max(0.0, self.low - self.measured, self.measured - self.high)


def plan_checks(
    results: dict[str, list[Run]],
    scale: Scale,
    phases: GoodputPhases | None,
    spread: dict[str, list[MechanismPhases]] | None = None,
) -> list[PlanCheck]:
    """One check per RESULT mechanism that ran and is calibrated; `spread`: each mechanism's calibration
    per repetition (the predicted range)."""
    checks = []
    for label in RESULT_MECHANISMS:
        runs, each = results.get(label, []), (spread or {}).get(label, [])
        pairs = [(r, p) for r in runs if r.goodput and (p := predicted(r, scale, phases, each)) is not None]
        if pairs:
            checks.append(
                PlanCheck(
                    label=label,
                    measured=statistics.median(r.goodput.strict for r, _ in pairs),  # type: ignore[union-attr]
                    predicted=statistics.median(p.prediction.goodput for _, p in pairs),
                    parts_s=pairs[0][1].prediction.parts_s,
                    low=statistics.median(p.low for _, p in pairs),
                    high=statistics.median(p.high for _, p in pairs),
                    step_ratio=statistics.median(r.metrics.median_step_s for r, _ in pairs)  # type: ignore[union-attr]
                    / phases.mechanisms[label].step_s,  # type: ignore[union-attr]
                )
            )
    return checks


def plan_error(checks: Sequence[PlanCheck]) -> str:
    """The largest |predicted - measured| strict goodput over the mechanisms ("nan": none calibrated)."""
    return f"{max(c.error for c in checks):.3f}" if checks else "nan"


def plan_figures(checks: Sequence[PlanCheck]) -> str:
    """The RESULT's fields on the predicted range: the largest distance of a measurement outside its range
    (0: all inside), and the widest range."""
    if not checks:
        return "plan_miss=nan plan_spread=nan"
    return (
        f"plan_miss={max(c.miss for c in checks):.3f} plan_spread={max(c.high - c.low for c in checks):.3f}"
    )


def plan_section(
    checks: Sequence[PlanCheck], phases: GoodputPhases | None, calibration: str = "file"
) -> list[str]:
    """The doc's lines on the plan's prediction against the measurement."""
    if phases is None:
        return ["The plan's prediction: no calibration (run `python -m bench.goodput --calibrate`).", ""]
    where = (
        "measured in this run (half its repetitions before the runs predicted, half after)"
        if calibration == "run"
        else f"`{phases.command}` measured ({phases.measured}), on whatever machine ran it"
    )
    lines = [
        "The plan's model (ops/plan/schedule.py) fed this job (its median step, its interval, the schedule's",
        f"faults) and the per-phase costs {where}, against the measurement; the range is the lowest and",
        "highest prediction of the calibration's repetitions each alone (seconds of the predicted wall by",
        "part):",
        "",
        "| mechanism | measured | predicted | range | error | outside range | overhead | steps | replayed | "
        "saves | faults | step: runs / calibration |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        parts = " | ".join(f"{c.parts_s[k]:.1f}" for k in ("overhead", "steps", "replay", "saves", "faults"))
        lines.append(
            f"| {c.label} | {c.measured:.3f} | {c.predicted:.3f} | {c.low:.3f}-{c.high:.3f} | "
            f"{c.error:.3f} | {c.miss:.3f} | {parts} | {c.step_ratio:.2f} |"
        )
    return [*lines, ""]


def result_line(
    results: dict[str, list[Run]], checks: Sequence[PlanCheck] = (), calibration: str = "file"
) -> str:
    kit = strict(results.get("kit", []))
    ft = strict(results.get("ft_launcher", []))
    torch = strict(results.get("torchrun", []))

    def ratio(a: float | None, b: float | None) -> str:
        return "nan" if a is None or b is None or b == 0 else f"{a / b:.2f}"

    # A planned fault that never fired would flatter its mechanism: the RESULT says how many there were.
    unfired = sum(
        len(r.metrics.faults_unfired) for m in RESULT_MECHANISMS for r in results.get(m, []) if r.metrics
    )
    return (
        f"RESULT kit_goodput={_fmt(kit)} vs_ft_launcher={ratio(kit, ft)} vs_torchrun={ratio(kit, torch)} "
        f"unfired={unfired} plan_error={plan_error(checks)} {plan_figures(checks)} calibration={calibration}"
    )


def _restarts(r: Run) -> str:
    m = r.metrics
    return "-" if m is None else f"{r.outcome.restarts} + {m.inprocess_restarts} in process"


DEFINITIONS = """\
Goodputs are over the job's wall time from the benchmark's clock (launch to exit, start-up included):
strict = steps in the result x median fault-free step / wall; the study's training goodput = time in steps
(replays included, checkpoint calls excluded) / wall; the study's infra goodput = (wall - sum of per-fault
shutdown + startup) / wall (fsdpkit.analysis.metrics). Lost steps = steps computed again; recovery = sum over
faults of fault -> end of the first step after the resume (min-max per fault in brackets); checkpoints =
time the loop was blocked by saves + the final drain.

| mechanism | interval | exit | wall | strict goodput | training goodput | infra goodput | lost steps | \
recovery (per fault) | checkpoints | restarts | median step |
|---|---|---|---|---|---|---|---|---|---|---|---|"""
BUDGET_INTRO = """\
Where the wall time went (seconds, median over the runs; fsdpkit.analysis.metrics.time_budget): useful =
steps in the result x median step; replayed = lost steps x median step; slow steps = step time beyond the
median (first steps, steps beside a background write); checkpoints = stalls + final drain; downtime = per
fault, fault -> training again; start-up = first trainer start -> first step; outside = launch -> first
trainer start and last end -> exit; other = the rest.

| mechanism | wall | useful | replayed | slow steps | checkpoints | downtime | start-up | outside | other |
|---|---|---|---|---|---|---|---|---|---|"""


def _row(mech: Mechanism, runs: Sequence[Run], scale: Scale) -> str:
    ms = [r.metrics for r in runs]
    per_fault = [f.recovery_s for m in ms if m for f in m.faults if f.recovery_s is not None]
    fault_range = f" ({min(per_fault):.1f}-{max(per_fault):.1f} s)" if per_fault else ""
    cells = [
        mech.label,
        interval_cell(mech, scale, runs),
        ", ".join(sorted({str(r.outcome.returncode) for r in runs})),
        _spread([r.outcome.wall_s for r in runs], ".0f", " s"),
        _spread([r.goodput.strict if r.goodput else None for r in runs]),
        _spread([r.goodput.training if r.goodput else None for r in runs]),
        _spread([r.goodput.infra if r.goodput else None for r in runs]),
        _spread([m.lost_steps if m else None for m in ms], ".0f"),
        _spread([m.recovery_s_total if m else None for m in ms], ".1f", " s") + fault_range,
        _spread([m.stall_s + m.drain_s if m else None for m in ms], ".1f", " s"),
        "; ".join(sorted({_restarts(r) for r in runs})),
        _spread([m.median_step_s if m else None for m in ms], ".3f", " s"),
    ]
    return f"| {' | '.join(cells)} |"


def render(results: dict[str, list[Run]], *, scale: Scale, reps: int, command: str, elapsed_s: float,
           png: str | None, checks: Sequence[PlanCheck] = (),
           phases: GoodputPhases | None = None, calibration: str = "file") -> str:  # fmt: skip
    """The section for docs/benchmarks.md: one row per mechanism (median and min-max over repetitions)."""
    schedule = ", ".join(f"{f['fault']}@{f['step']}" for f in _schedule(results))
    lines = [
        "## Goodput: the study's 5-fault schedule, kit vs its own variants, ft_launcher and torchrun",
        "",
        f"Command: `{command}` ({elapsed_s / 60:.1f} min on this machine; {reps} run(s) per mechanism,",
        "median with min-max when more than one). Same job for every mechanism: tiny Llama, 2 ranks x 1",
        f"thread (gloo), {scale.steps} steps, the study's seeded schedule (seed 42, {scale.faults} fault(s)",
        f"after step {scale.scaled(STUDY_AFTER_STEP)}, kinds {scale.kinds}; all on rank 1):",
        f"{schedule or '-'}.",
        "",
        DEFINITIONS,
        *(_row(m, results[m.label], scale) for m in MECHANISMS if results.get(m.label)),
        "",
        BUDGET_INTRO,
    ]
    for mech in MECHANISMS:
        budgets = [time_budget(r.metrics, r.outcome.wall_s) for r in results.get(mech.label, []) if r.metrics]
        if budgets:
            cells = [_fmt(_median([getattr(b, name) for b in budgets]), ".1f") for name in BUDGET]
            lines.append(f"| {mech.label} | {' | '.join(cells)} |")
    lines += ["", "Mechanisms:", ""]
    lines += [f"- **{m.label}**: {m.describe}." for m in MECHANISMS if m.label in results]
    lines += [
        f"- torchrun's collective timeout is {scale.baseline_timeout_s:g} s; the kit's in-process runs use",
        "  bench/recovery.py's 10 s gloo timeout (the launcher's learned heartbeat timeout sees a hang",
        "  first).",
        "",
    ]
    if png:
        lines += [f"![The kit's run: steps per rank over time, faults, recoveries]({png})", ""]
    lines += plan_section(checks, phases, calibration)
    lines += ["```", result_line(results, checks, calibration), "```", ""]
    return "\n".join(lines)


def _schedule(results: dict[str, list[Run]]) -> list[dict]:  # type: ignore[type-arg]
    """The faults as the kit's first run logged them (one per fault)."""
    for r in results.get("kit", []):
        if r.metrics is not None:
            return [{"fault": f.kind, "step": f.step} for f in r.metrics.faults]
    return []


def _only(parser: argparse.ArgumentParser, value: str | None) -> set[str] | None:
    """The labels of `--only`, each a known mechanism (else a one-line usage error)."""
    if value is None:
        return None
    labels = {m.label for m in MECHANISMS}
    chosen = {v.strip() for v in value.split(",")}
    unknown = sorted(chosen - labels) if chosen != {""} else [""]
    if unknown:
        parser.error(f"--only: unknown mechanism {unknown[0]!r}; choose from {', '.join(sorted(labels))}")
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="200 steps, scaled by 1/10; the RESULT mechanisms only; no doc"
    )
    parser.add_argument("--reps", type=int, default=None, help="runs per mechanism (default 1)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # the test's tiny run
    parser.add_argument("--doc", type=Path, default=None, help=argparse.SUPPRESS)  # where to write the doc
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure each mechanism's per-phase costs (fault-free and single-fault runs, --reps times, "
        f"default {CALIBRATION_REPS}) for the plan's validation: writes ops/plan/calibration.json",
    )
    parser.add_argument(
        "--calibration",
        choices=("run", "file"),
        default=None,
        help="where the plan's validation gets its per-phase costs: run (default; measured in this run, "
        "half the repetitions before the runs it predicts, half after) or file (ops/plan/calibration.json, "
        "measured on another day or machine; the smoke run's default)",
    )
    parser.add_argument(
        "--calibration-reps",
        type=int,
        default=2,
        help="repetitions of the same-run calibration (default 2; >= 2 gives the predicted range)",
    )
    parser.add_argument(
        "--only",
        default=None,
        metavar="LABELS",
        help=f"comma-separated mechanisms to run ({', '.join(m.label for m in MECHANISMS)}), for a look at "
        "one of them: no doc is written; ratios to mechanisms not run print nan",
    )
    return parser


def _chosen_mechanisms(scale: Scale, only: set[str] | None) -> list[Mechanism] | None:
    """The mechanisms this scale runs (NVRx's only where ft_launcher is installed), narrowed by --only;
    None, with the error printed, where the full scale lacks NVRx."""
    nvrx = shutil.which("ft_launcher", path=str(Path(sys.executable).parent)) is not None
    mechanisms = [m for m in MECHANISMS if nvrx or m.base not in NVRX_MECHANISMS]
    if not nvrx:
        if scale.name == "full":
            print("error: NVRx is not installed; run `make bench-setup` (nvidia-resiliency-ext==0.4.1)",
                  file=sys.stderr)  # fmt: skip
            return None
        print("note: NVRx is not installed: the ft_launcher run is skipped", flush=True)
    if scale.name == "smoke":
        mechanisms = [m for m in mechanisms if m.label in ("kit", "torchrun")]  # the test's time budget
    elif scale.name == "quick" and only is None:
        mechanisms = [m for m in mechanisms if m.label in RESULT_MECHANISMS]
    if only is not None:
        mechanisms = [m for m in mechanisms if m.label in only]
    return mechanisms


def _progress_line(mech: Mechanism, rep: int, reps: int, run: Run) -> str:
    """One run's outcome as the benchmark prints it while it goes."""
    m, g = run.metrics, run.goodput
    recovered = _fmt(m.recovery_s_total if m else None, ".1f", " s")
    return (
        f"{mech.label:12} rep {rep + 1}/{reps}: exit {run.outcome.returncode}, wall "
        f"{run.outcome.wall_s:.1f} s, strict {_fmt(g.strict if g else None)}, lost "
        f"{m.lost_steps if m else '-'}, recovery {recovered}"
        + (f"  [{run.outcome.note}]" if run.outcome.note else "")
    )


def _measure_all(
    mechanisms: Sequence[Mechanism], scale: Scale, workdir: Path, *, reps: int, doc: Path | None
) -> tuple[dict[str, list[Run]], Path | None]:
    """Every mechanism `reps` times, each run printed as it ends: (runs per mechanism label, the kit's first
    run's timeline PNG, drawn beside `doc` when there is one)."""
    results: dict[str, list[Run]] = {}
    png: Path | None = None
    for rep in range(reps):
        for index, mech in enumerate(mechanisms, start=rep * len(MECHANISMS)):
            run = measure(mech, scale, workdir, index, timeout_s=2400)
            results.setdefault(mech.label, []).append(run)
            print(_progress_line(mech, rep, reps, run), flush=True)
            m = run.metrics
            if doc is not None and mech.label == "kit" and rep == 0 and m is not None:
                png = doc.with_name(doc.stem + "_timeline.png")
                folder = run_dir(workdir, mech, index)
                write_timeline(read_events(folder), m, png, title="bench.goodput: the kit, study schedule")
    return results, png


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1 (runs per mechanism), got {args.reps}")
    if args.calibration_reps < 1:
        parser.error(f"--calibration-reps must be >= 1 (same-run calibrations), got {args.calibration_reps}")
    only = _only(parser, args.only)
    scale = SCALES["smoke" if args.smoke else "quick" if args.quick else "full"]
    mechanisms = _chosen_mechanisms(scale, only)
    if mechanisms is None:
        return 2
    try:
        sections = read_sections()
        phases, spread = goodput_phases(sections), spreads(sections.get("goodput_phases"), CALIBRATION_FAULTS)
    except (CalibrationError, PlanInputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.calibrate:
        return calibrate_main(mechanisms, reps=args.reps or CALIBRATION_REPS)
    args.reps = args.reps or 1
    calibration = args.calibration or ("file" if scale.name == "smoke" else "run")
    doc = args.doc or (DOC if scale.name == "full" and only is None else None)
    flags = (" --quick" if args.quick else "") + (f" --only {args.only}" if only is not None else "")
    flags += f" --calibration {calibration}" if calibration == "file" and scale.name != "smoke" else ""
    command = f"python -m bench.goodput{flags}{f' --reps {args.reps}' if args.reps > 1 else ''}"
    workdir = Path(tempfile.mkdtemp(prefix="kit-bench-goodput-"))
    started = time.monotonic()
    calibrated: Records = {}
    cal_reps, cal_mechs = args.calibration_reps, [m for m in mechanisms if m.label in RESULT_MECHANISMS]
    before = (cal_reps + 1) // 2 if calibration == "run" else 0
    try:  # the same-run calibration brackets the runs it predicts: half before, half after
        for rep in range(before):
            calibration_rep(cal_mechs, scale, workdir, rep, cal_reps, calibrated)
        results, png = _measure_all(mechanisms, scale, workdir, reps=args.reps, doc=doc)
        for rep in range(before, cal_reps if calibration == "run" else 0):
            calibration_rep(cal_mechs, scale, workdir, rep, cal_reps, calibrated)
    finally:
        release(workdir, keep=args.keep)
    elapsed = time.monotonic() - started
    if calibration == "run":
        phases, spread = same_run_phases(calibrated, scale, cal_reps)
    checks = plan_checks(results, scale, phases, spread)
    text = render(results, scale=scale, reps=args.reps, command=command, elapsed_s=elapsed,
                  png=None if png is None else f"benchmarks/{png.name}", checks=checks,
                  phases=phases, calibration=calibration)  # fmt: skip
    print(text)
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text, encoding="utf-8")
        print(f"wrote {doc}")
    print(result_line(results, checks, calibration))
    return 0


def same_run_phases(
    calibrated: Records, scale: Scale, reps: int
) -> tuple[GoodputPhases | None, dict[str, list[MechanismPhases]]]:
    """The costs this run's own calibration measured, and each repetition's alone (None, {}: too few
    finished runs to calibrate, said in one line)."""
    try:
        section = calibration_section(calibrated, scale, reps)
    except PlanInputError as exc:
        print(f"note: the same-run calibration is incomplete ({exc}): no prediction", flush=True)
        return None, {}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    raw = {**section, "measured": stamp, "command": "this run's calibration"}
    each = spreads(section, CALIBRATION_FAULTS)
    for label, m in section["mechanisms"].items():
        print(_costs_line(label, m))
        for i, rep in enumerate(each.get(label, [])):
            print(_costs_line(f"  rep {i + 1}", dataclasses.asdict(rep)))
    return goodput_phases({"goodput_phases": raw}), each


def _costs_line(label: str, m: dict) -> str:  # type: ignore[type-arg]
    """One calibration's costs (a MechanismPhases as a dict), as --calibrate and a same-run one print."""
    faults = ", ".join(f"{k} {v:.2f} s" for k, v in m["fault_s"].items())
    return (
        f"{label:12} step {m['step_s']:.3f} s, overhead {m['overhead_s']:.2f} s, save {m['save_s']:.3f} s, "
        f"{faults}, keeps live state: {m['keeps_live_state']}"
    )


def calibrate_main(mechanisms: Sequence[Mechanism], *, reps: int) -> int:
    """`--calibrate`: the RESULT mechanisms' per-phase costs, at the quick scale's collective timeout."""
    chosen = [m for m in mechanisms if m.label in RESULT_MECHANISMS]
    workdir = Path(tempfile.mkdtemp(prefix="kit-bench-calibrate-"))
    try:
        section = run_calibration(chosen, SCALES["quick"], workdir, reps)
    except PlanInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        release(workdir, keep=False)
    path = write_section(
        "goodput_phases", section, command=f"python -m bench.goodput --calibrate --reps {reps}"
    )
    for label, m in section["mechanisms"].items():
        print(_costs_line(label, m))
    print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
