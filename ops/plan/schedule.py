"""The plan's model fed a known fault schedule instead of rates: a measured job's wall time from its per-phase
costs (bench.goodput's validation), and the inverse that gets those costs from measured runs
(bench.goodput --calibrate).

The same first-order account as ops/plan/model.py, with the faults' steps known instead of their rates:

    wall = overhead + (steps + replayed) x step + saves x save + sum over faults of fault_s[kind]
    strict goodput = steps x step / wall

replayed: nothing for a mechanism that recovers in process from the live state; otherwise the steps since
the newest committed save: a fault at the top of step s, with a save every I steps, resumes from
I x floor((s - 1) / I), so the steps after it up to s - 1 are computed again. The calibration reads the
same account backwards: a fault-free run gives the overhead (its wall time beyond its steps and saves) and
one save's cost; a single-fault run gives its fault's cost: the downtime its events measured (the fault until
training restarted) plus its steps' slowness beyond what its saves explain (a restarted process' first
steps). Measured from the events, not as a difference of wall times, which scatter by a second or more
between runs on a 2-core machine: more than the kit's whole cost of a fault.

A calibration is itself a sample: `calibrate_each` calibrates each repetition alone, and `predict_range`
carries their spread into the prediction (a goodput range, not one number).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsdpkit.ops.plan.calibration import MechanismPhases
from fsdpkit.ops.plan.failures import PlanInputError


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What one measured run gives the calibration (from its events and the launcher's wall clock)."""

    wall_s: float
    step_s: float
    """The run's median fault-free step."""
    steps: int
    """Steps in the result."""
    lost_steps: int
    """Steps computed again after faults."""
    saves: int
    """Saves committed."""
    save_cost_s: float
    """The loop's time in saves and in steps slower than the median (beside a background write, or the
    first steps of a restarted process)."""
    downtime_s: float = 0.0
    """Per fault, the fault until training restarted, summed (from the events)."""


@dataclass(frozen=True, kw_only=True)
class ScheduledRun:
    """A job with a known fault schedule, for the model to predict."""

    steps: int
    step_s: float
    saves: int
    interval: int | None
    """Steps between saves; None when the interval varied (auto): then no fault may need a replay."""
    faults: tuple[tuple[str, int], ...]
    """(kind, step) of each fault, in order."""


@dataclass(frozen=True, kw_only=True)
class Prediction:
    wall_s: float
    goodput: float
    replayed_steps: int
    parts_s: dict[str, float]
    """overhead, steps, replay, saves, faults: the predicted wall time, split."""


def replayed_steps(fault_step: int, interval: int) -> int:
    """Steps computed again when a fault at the top of `fault_step` resumes from the newest save."""
    done = fault_step - 1
    return done - interval * (done // interval)


def predict(
    run: ScheduledRun, phases: MechanismPhases, *, fault_extra_s: Mapping[str, float] | None = None
) -> Prediction:
    """The wall time and strict goodput `phases` predict for `run` (see the module docstring).
    `fault_extra_s` adds seconds to a kind's cost where the run's setting differs from the calibration's
    (a longer collective timeout: its hang waits that much longer)."""
    missing = sorted({kind for kind, _ in run.faults} - set(phases.fault_s))
    if missing:
        raise PlanInputError(
            f"no calibrated cost for fault kind {missing[0]!r}; rerun python -m bench.goodput --calibrate"
        )
    replay = 0
    if not phases.keeps_live_state:
        if run.interval is None:
            raise PlanInputError("a mechanism that replays needs a fixed checkpoint interval to be predicted")
        replay = sum(replayed_steps(step, run.interval) for _, step in run.faults)
    extra = fault_extra_s or {}
    parts = {
        "overhead": phases.overhead_s,
        "steps": run.steps * run.step_s,
        "replay": replay * run.step_s,
        "saves": run.saves * phases.save_s,
        "faults": sum(phases.fault_s[kind] + extra.get(kind, 0.0) for kind, _ in run.faults),
    }
    wall = sum(parts.values())
    return Prediction(
        wall_s=wall, goodput=run.steps * run.step_s / wall, replayed_steps=replay, parts_s=parts
    )


def calibrate(fault_free: Sequence[RunRecord], faulted: Mapping[str, Sequence[RunRecord]]) -> MechanismPhases:
    """A mechanism's costs from its fault-free runs (medians) and its single-fault runs per kind (the mean: a
    fault's expected cost, where its runs sample the detection's period). It keeps the live state when no
    calibration fault made it compute a step again."""
    if not fault_free or any(r.saves <= 0 for r in fault_free):
        raise PlanInputError("calibration needs fault-free runs that committed at least one save")
    save_s = statistics.median(r.save_cost_s / r.saves for r in fault_free)
    overhead = statistics.median(
        r.wall_s - (r.steps + r.lost_steps) * r.step_s - r.saves * save_s for r in fault_free
    )
    fault_s: dict[str, float] = {}
    for kind, runs in faulted.items():
        if not runs:
            raise PlanInputError(f"calibration of fault kind {kind!r} has no completed run")
        fault_s[kind] = statistics.fmean(
            r.downtime_s + max(0.0, r.save_cost_s - r.saves * save_s) for r in runs
        )
    return MechanismPhases(
        step_s=statistics.median(r.step_s for r in fault_free),
        overhead_s=max(0.0, overhead),
        save_s=save_s,
        fault_s=fault_s,
        keeps_live_state=all(r.lost_steps == 0 for runs in faulted.values() for r in runs),
    )


RECORD_FIELDS = ("wall_s", "step_s", "steps", "lost_steps", "saves", "save_cost_s", "downtime_s")


def records(raw: Sequence[Mapping[str, float]]) -> list[RunRecord]:
    """RunRecords from a calibration section's stored `runs` (one-line PlanInputError when malformed)."""
    try:
        return [RunRecord(**{k: r[k] for k in RECORD_FIELDS}) for r in raw]  # type: ignore[arg-type]
    except (KeyError, TypeError) as exc:
        raise PlanInputError(
            f"calibration run record without {exc}: rerun python -m bench.goodput --calibrate"
        ) from None


def calibrate_each(
    fault_free: Sequence[RunRecord], faulted: Mapping[str, Sequence[RunRecord]]
) -> list[MechanismPhases]:
    """One calibration per repetition (its fault-free run and its run of each kind), so that their spread
    shows the calibration's own noise; each keeps the pooled calibration's `keeps_live_state`. Empty when
    fewer than two repetitions completed (no spread to show)."""
    pooled = calibrate(fault_free, faulted)
    reps = min([len(fault_free), *(len(runs) for runs in faulted.values())])
    if reps < 2:
        return []
    return [
        dataclasses.replace(
            calibrate([fault_free[i]], {kind: [runs[i]] for kind, runs in faulted.items()}),
            keeps_live_state=pooled.keeps_live_state,
        )
        for i in range(reps)
    ]


@dataclass(frozen=True, kw_only=True)
class RangedPrediction:
    """The pooled calibration's prediction, and the lowest and highest strict goodput any single
    repetition's calibration predicts (both the pooled figure when there is no spread)."""

    prediction: Prediction
    low: float
    high: float


def predict_range(
    run: ScheduledRun,
    pooled: MechanismPhases,
    each: Sequence[MechanismPhases] = (),
    *,
    fault_extra_s: Mapping[str, float] | None = None,
) -> RangedPrediction:
    """`predict` with the pooled costs, and the range the repetitions' own costs give."""
    mid = predict(run, pooled, fault_extra_s=fault_extra_s)
    goodputs = [mid.goodput, *(predict(run, p, fault_extra_s=fault_extra_s).goodput for p in each)]
    return RangedPrediction(prediction=mid, low=min(goodputs), high=max(goodputs))


def spreads(section: Mapping[str, Any] | None, kinds: Sequence[str]) -> dict[str, list[MechanismPhases]]:
    """Each mechanism's calibration per repetition (`calibrate_each`) from a goodput_phases section's stored
    runs, for the fault `kinds` (none where fewer than two repetitions of each completed)."""
    out: dict[str, list[MechanismPhases]] = {}
    for label, m in ((section or {}).get("mechanisms") or {}).items():
        runs = {kind: records(raw) for kind, raw in (m.get("runs") or {}).items()}
        free = runs.pop("none", [])
        if free and all(runs.get(k) for k in kinds):
            out[label] = calibrate_each(free, {k: runs[k] for k in kinds})
    return out
