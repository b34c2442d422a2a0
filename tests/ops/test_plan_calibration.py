"""The plan's measured side: the calibration file, the schedule-fed model and its inverse (what
bench.goodput's validation and --calibrate use), the control plane's projection, and `make train-job`'s
plan line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from fsdpkit.ops.plan.calibration import (
    CalibrationError,
    MechanismPhases,
    goodput_phases,
    phase_times,
    read_sections,
    scale_phases,
    write_section,
)
from fsdpkit.ops.plan.failures import PlanInputError
from fsdpkit.ops.plan.planner import GOODPUT_MARGIN, PlanRequest, job_summary, make_plan
from fsdpkit.ops.plan.schedule import (
    RunRecord,
    ScheduledRun,
    calibrate,
    calibrate_each,
    predict,
    predict_range,
    records,
    replayed_steps,
    spreads,
)

PHASES = MechanismPhases(
    step_s=0.2, overhead_s=3.0, save_s=0.5, fault_s={"exception": 2.0, "hang": 12.0}, keeps_live_state=False
)


def test_replayed_steps_count_back_to_the_newest_save() -> None:
    """Saves every 50 steps; a fault at the top of step s has done s - 1 steps (the bench.goodput schedule's
    faults at 8, 30, 72, 165, 191 replay 7 + 29 + 21 + 14 + 40 = 111, the baselines' measured lost steps)."""
    assert [replayed_steps(s, 50) for s in (8, 30, 72, 165, 191)] == [7, 29, 21, 14, 40]
    assert replayed_steps(51, 50) == 0 and replayed_steps(1, 50) == 0


def test_predict_adds_the_parts_by_hand() -> None:
    run = ScheduledRun(steps=200, step_s=0.2, saves=4, interval=50, faults=(("exception", 8), ("hang", 30)))
    p = predict(run, PHASES, fault_extra_s={"hang": 50.0})
    assert p.replayed_steps == 7 + 29
    assert p.parts_s == pytest.approx(
        {"overhead": 3.0, "steps": 40.0, "replay": 36 * 0.2, "saves": 2.0, "faults": 2.0 + 12.0 + 50.0}
    )
    assert p.goodput == pytest.approx(40.0 / (3.0 + 40.0 + 7.2 + 2.0 + 64.0))


def test_a_mechanism_that_keeps_its_live_state_replays_nothing_and_needs_no_fixed_interval() -> None:
    live = MechanismPhases(
        step_s=0.2, overhead_s=3.0, save_s=0.05, fault_s={"hang": 1.0}, keeps_live_state=True
    )
    p = predict(ScheduledRun(steps=100, step_s=0.2, saves=9, interval=None, faults=(("hang", 30),)), live)
    assert p.replayed_steps == 0 and p.wall_s == pytest.approx(3.0 + 20.0 + 0.45 + 1.0)
    with pytest.raises(PlanInputError, match="fixed checkpoint interval"):
        predict(ScheduledRun(steps=100, step_s=0.2, saves=9, interval=None, faults=(("hang", 30),)), PHASES)
    with pytest.raises(PlanInputError, match="no calibrated cost for fault kind 'kill'"):
        predict(ScheduledRun(steps=100, step_s=0.2, saves=9, interval=10, faults=(("kill", 30),)), PHASES)


SLOW_S = 0.25
"""Each run's slow first steps, beyond its saves."""


def _record(
    phases: MechanismPhases, *, steps: int, interval: int, fault: tuple[str, int] | None
) -> RunRecord:
    """A run as the model accounts for it, plus SLOW_S of slow first steps that the fault's downtime does not
    include (the calibration must read the same phases back)."""
    faults = (fault,) if fault else ()
    saves = steps // interval
    run = ScheduledRun(steps=steps, step_s=phases.step_s, saves=saves, interval=interval, faults=faults)
    p = predict(run, phases)
    return RunRecord(
        wall_s=p.wall_s + SLOW_S, step_s=phases.step_s, steps=steps, lost_steps=p.replayed_steps, saves=saves,
        save_cost_s=saves * phases.save_s + SLOW_S, downtime_s=p.parts_s["faults"] - SLOW_S if fault else 0.0,
    )  # fmt: skip


def test_calibrate_reads_the_models_account_backwards() -> None:
    free = [_record(PHASES, steps=60, interval=5, fault=None)] * 3
    faulted = {
        kind: [_record(PHASES, steps=14, interval=5, fault=(kind, 12))] for kind in ("exception", "hang")
    }
    got = calibrate(free, faulted)
    # the fault-free runs' slow steps count in a save's cost (12 saves); a fault run's slow steps beyond its
    # 2 saves' share are its fault's: SLOW_S - 2 x SLOW_S / 12 of the fault's own SLOW_S
    assert got.save_s == pytest.approx(0.5 + SLOW_S / 12) and got.overhead_s == pytest.approx(3.0)
    shared = 2 * SLOW_S / 12
    assert got.fault_s == pytest.approx({"exception": 2.0 - shared, "hang": 12.0 - shared})
    assert got.keeps_live_state is False  # the faults replayed a step
    with pytest.raises(PlanInputError, match="fault-free runs that committed"):
        calibrate([], faulted)


def test_each_repetition_calibrated_alone_gives_the_predictions_range() -> None:
    """Two repetitions whose hang cost 10 s and 14 s: the pooled calibration takes their mean (12 s), each
    alone its own; the schedule's prediction with each brackets the pooled one."""
    cheap, dear = (dataclasses.replace(PHASES, fault_s={**PHASES.fault_s, "hang": h}) for h in (10.0, 14.0))
    free = [_record(PHASES, steps=60, interval=5, fault=None)] * 2
    faulted = {
        "exception": [_record(PHASES, steps=14, interval=5, fault=("exception", 12))] * 2,
        "hang": [_record(p, steps=14, interval=5, fault=("hang", 12)) for p in (cheap, dear)],
    }
    each = calibrate_each(free, faulted)
    shared = 2 * SLOW_S / 12
    assert [p.fault_s["hang"] for p in each] == pytest.approx([10.0 - shared, 14.0 - shared])
    pooled = calibrate(free, faulted)
    assert pooled.fault_s["hang"] == pytest.approx(12.0 - shared)
    run = ScheduledRun(steps=200, step_s=0.2, saves=4, interval=50, faults=(("hang", 30), ("hang", 90)))
    ranged = predict_range(run, pooled, each)
    low, high = (predict(run, p).goodput for p in (each[1], each[0]))  # the dearer hang: the lower goodput
    assert ranged.low == pytest.approx(low) and ranged.high == pytest.approx(high)
    assert low < ranged.prediction.goodput < high
    assert predict_range(run, pooled).low == predict_range(run, pooled).high == ranged.prediction.goodput
    assert calibrate_each(free[:1], {k: v[:1] for k, v in faulted.items()}) == []  # one repetition: no spread


def test_the_spread_is_read_back_from_a_sections_stored_runs() -> None:
    free = _record(PHASES, steps=60, interval=5, fault=None)
    hang = _record(PHASES, steps=14, interval=5, fault=("hang", 12))
    runs = {"none": [free.__dict__] * 3, "hang": [hang.__dict__] * 3}
    got = spreads(
        {"mechanisms": {"kit": {"runs": runs}, "torchrun": {"runs": {"none": runs["none"]}}}}, ["hang"]
    )
    assert list(got) == ["kit"] and len(got["kit"]) == 3  # torchrun: no hang run, no spread
    assert got["kit"][0].fault_s["hang"] == pytest.approx(calibrate([free], {"hang": [hang]}).fault_s["hang"])
    assert spreads(None, ["hang"]) == {}
    with pytest.raises(PlanInputError) as err:
        records([{"wall_s": 1.0}])
    assert str(err.value).startswith("calibration run record without 'step_s': rerun python -m bench.goodput")


def test_a_section_is_rewritten_alone_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    write_section("scale", {"rows": [{"nodes": 4, "detect_s": 1.3, "reform_s": 0.4}]}, command="a", path=path)
    mechs = {"kit": {**PHASES.__dict__, "fault_s": dict(PHASES.fault_s)}}
    data = {"collective_timeout_s": 10.0, "mechanisms": mechs}
    write_section("goodput_phases", data, command="python -m bench.goodput --calibrate", path=path)
    sections = read_sections(path)
    assert set(sections) == {"scale", "goodput_phases"} and sections["scale"]["command"] == "a"
    assert goodput_phases(sections).mechanisms["kit"] == PHASES  # type: ignore[union-attr]
    assert scale_phases({}) is None and goodput_phases({}) is None  # not calibrated: not an error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", "expected a JSON object of sections"),
        (
            '{"scale": {"measured": "x", "command": "c", "rows": [{"nodes": 4}]}}',
            "calibration scale: missing",
        ),
        (
            '{"scale": {"measured": "x", "command": "c", '
            '"rows": [{"nodes": 4, "detect_s": NaN, "reform_s": 1}]}}',
            "calibration scale.detect_s=nan: not a finite number",
        ),
    ],
)
def test_a_bad_calibration_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CalibrationError) as err:
        scale_phases(read_sections(path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_control_plane_is_measured_where_it_was_and_projected_along_its_fit_beyond() -> None:
    rows = [{"nodes": n, "detect_s": 1.25, "reform_s": 0.25 * n**0.5} for n in (4, 16, 64)]
    scale = scale_phases({"scale": {"measured": "today", "command": "python -m bench.scale", "rows": rows}})
    phases, sources = phase_times(16, scale, replacement_s=900.0)
    assert phases.reform_s == pytest.approx(1.0) and sources["reform_s"].startswith("measured:")
    phases, sources = phase_times(1024, scale, replacement_s=600.0)
    assert phases.reform_s == pytest.approx(0.25 * 32) and phases.node_detect_s == pytest.approx(1.25)
    assert "projected" in sources["reform_s"] and "N^0.50" in sources["reform_s"]
    assert phases.replacement_s == 600.0 and "study" in sources["inprocess_restart_s"]


def test_the_committed_calibration_is_used_by_make_plan() -> None:
    """The repository's own file (written by the benchmarks) feeds the plan: no default is left unlabelled."""
    plan = make_plan(PlanRequest(nodes=1024))
    for name, phase in plan.header["phases"].items():
        assert math.isfinite(phase["s"]) and phase["source"], name
    assert plan.header["phases"]["reform_s"]["source"].startswith(("measured", "projected"))
    assert plan.outcome("kit").goodput >= 0.95


def test_train_job_line_warns_only_where_the_job_costs_goodput() -> None:
    line, notes = job_summary(nodes=1024, spares=2, model="llama3.1-70b", batch_tokens=4 << 20, tiers=True,
                              interval="auto")  # fmt: skip
    assert line.startswith("plan: expected strict goodput 0.9") and notes == []
    _, notes = job_summary(nodes=1024, spares=0, model="llama3.1-70b", batch_tokens=4 << 20, tiers=True,
                           interval=5000)  # fmt: skip
    assert [n.split(":")[0] for n in notes] == ["SPARES=0", "CHECKPOINT_INTERVAL=5000"]
    # a small job at the trainer's default interval loses less than the margin: no warning
    _, notes = job_summary(nodes=4, spares=0, model="llama3.1-8b", batch_tokens=32 * 8192, tiers=True,
                           interval=100)  # fmt: skip
    assert notes == [] and GOODPUT_MARGIN > 0


def test_the_committed_calibration_file_is_valid_json() -> None:
    path = Path(__file__).resolve().parents[2] / "ops" / "plan" / "calibration.json"
    sections = json.loads(path.read_text(encoding="utf-8"))
    assert goodput_phases(sections) is not None and scale_phases(sections) is not None
