"""bench.recovery's arithmetic on measured figures: paired ratios, the stability verdict, the recovery phases.

Pure functions on hand-made numbers and events (no benchmark is run here).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import recovery
from bench.stability import Stability, stability

STABLE = {
    "kill_recovery_ratio": 0.36,
    "inprocess_ratio": 0.08,
    "hang_detect_steps": 3.0,
    "false_restarts": 0.0,
    "node_recovery_ratio": 2.0,
    "pod0_survived": 1.0,
    "drain_lost_steps": 0.0,
    "node_freeze_ratio": 2.5,
}


def test_paired_ratio_is_the_median_of_per_repetition_ratios_with_their_spread() -> None:
    fig = recovery.paired_ratio([2.0, 3.0, None, 4.0, 9.0], [1.0, 1.0, 1.0, None, 3.0])
    assert (fig.value, fig.low, fig.high, fig.n) == (3.0, 2.0, 3.0, 3)  # a rep missing either side drops out
    assert fig.text() == "3.00" and fig.spread() == "2.00-3.00"
    assert recovery.paired_ratio([], []).text() == "nan"


def judge(runs: list[dict]) -> list[Stability]:
    return stability(runs, recovery.RESULT_KEYS, counts=recovery.COUNT_KEYS)


def test_runs_within_ten_percent_are_stable() -> None:
    runs = [STABLE, {**STABLE, "node_recovery_ratio": 2.19}, {**STABLE, "kill_recovery_ratio": 0.39}]
    rows = {r.key: r for r in judge(runs)}
    assert all(r.ok for r in rows.values())
    assert rows["node_recovery_ratio"].spread == pytest.approx(0.095)
    assert [r.key for r in judge(runs)] == list(recovery.RESULT_KEYS)


def test_a_ratio_eleven_percent_apart_a_differing_count_or_a_missing_figure_is_not_stable() -> None:
    runs = [STABLE, {**STABLE, "node_recovery_ratio": 2.22}, STABLE]
    assert [r.key for r in judge(runs) if not r.ok] == ["node_recovery_ratio"]
    runs = [STABLE, {**STABLE, "drain_lost_steps": 1.0}, {**STABLE, "hang_detect_steps": None}]
    rows = {r.key: r for r in judge(runs)}
    assert math.isinf(rows["drain_lost_steps"].spread or 0.0) and not rows["drain_lost_steps"].ok
    assert rows["hang_detect_steps"].spread is None and not rows["hang_detect_steps"].ok


def test_check_stability_reads_json_runs_and_exits_by_the_verdict(tmp_path: Path, capsys) -> None:
    paths = []
    for i, node in enumerate((2.0, 2.1, 2.05)):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"result": {**STABLE, "node_recovery_ratio": node}}), encoding="utf-8")
        paths.append(path)
    assert recovery.main(["--check-stability", *map(str, paths)]) == 0
    assert "stable: yes across 3 runs" in capsys.readouterr().out
    paths[2].write_text(json.dumps({"result": {**STABLE, "node_recovery_ratio": None}}), encoding="utf-8")
    assert recovery.main(["--check-stability", *map(str, paths)]) == 1
    assert "stable: no (node_recovery_ratio)" in capsys.readouterr().out
    paths[2].write_text("{not json", encoding="utf-8")
    assert recovery.main(["--check-stability", *map(str, paths)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {paths[2]} is not a bench.recovery --json file") and err.count("\n") == 1


def _event(ts: float, kind: str, role: str, **fields: object) -> dict[str, object]:
    return {"ts": ts, "kind": kind, "role": role, **fields}


def test_recovery_phases_split_a_spare_takeover_at_the_events() -> None:
    events = [
        _event(99.0, "step", "trainer", rank=1, step=11),
        _event(100.0, "fault", "trainer", rank=1, fault="node"),
        _event(100.5, "worker_failed", "launcher"),
        _event(102.7, "restart", "launcher"),
        _event(102.75, "group_started", "launcher"),
        _event(102.8, "group_started", "launcher"),  # the spare's launcher
        _event(103.0, "start", "trainer", rank=0),
        _event(103.1, "start", "trainer", rank=1),
        _event(103.5, "resume", "trainer", rank=0, duration_s=0.5),  # ts: the load began
        _event(103.6, "resume", "trainer", rank=1, duration_s=0.5),
        _event(105.5, "step", "trainer", rank=0, step=11),
        _event(105.6, "step", "trainer", rank=1, step=11),
        _event(106.0, "step", "trainer", rank=0, step=12),
    ]
    phases = recovery.recovery_phases(events)
    assert phases is not None and list(phases) == list(recovery.PHASES)
    expected = {"detect": 0.5, "rendezvous": 2.3, "worker start": 0.3, "setup": 0.5, "checkpoint load": 0.5}
    expected["redo"] = 1.5
    assert phases == pytest.approx(expected)
    assert recovery.recovery_phases([e for e in events if e["kind"] != "group_started"]) is None


def test_the_doc_keeps_its_hand_written_notes(tmp_path: Path) -> None:
    doc = tmp_path / "recovery.md"
    assert recovery.with_notes("## new tables\n", doc) == "## new tables\n"
    doc.write_text(f"## old tables\n\n{recovery.NOTES_MARK}\n- a reading note\n", encoding="utf-8")
    assert (
        recovery.with_notes("## new tables\n", doc)
        == f"## new tables\n\n{recovery.NOTES_MARK}\n- a reading note\n"
    )


def test_every_ratio_case_runs_reps_times_and_quick_keeps_only_the_result_cases() -> None:
    full = dict(recovery.plan(False, reps=7, nvrx=True))
    ratio_cases = [c for c, r in full.items() if r == 7]
    assert {(c.mechanism, c.fault) for c in ratio_cases} == {
        ("kit", "kill"), ("ft_launcher", "kill"), ("kit", "hang"), ("kit-inproc", "exception"),
        ("nvrx-wrapper", "exception"), ("kit+spare", "node"), ("kit+spare", "freeze"),
    }  # fmt: skip
    assert set(full.values()) == {7, 3, 1}
    quick = dict(recovery.plan(True, reps=2, nvrx=False))
    assert all(c.mechanism not in recovery.NVRX_MECHANISMS for c in quick)
    assert len([c for c, r in quick.items() if r == 2]) == 5 and len(quick) == 7
    empty = recovery.figures(recovery.Results())
    assert recovery.result_line(empty) == "RESULT " + " ".join(f"{k}=nan" for k in recovery.RESULT_KEYS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reps", "0"], "--reps must be a whole number from 1 to 50, got 0"),
        (["--json", "DIR"], "cannot write there; give a file in a writable folder"),
    ],
)
def test_bad_arguments_are_one_line_errors_before_any_run(argv, message, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        recovery.main([str(tmp_path) if a == "DIR" else a for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err.splitlines()[-1]
