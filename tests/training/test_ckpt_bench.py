"""bench.checkpoint's summary over repetitions (no benchmark is run here: the ranks' reports are built)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.checkpoint import COMPETITORS, RESULT_KEYS, Measured, _summarize_reps, _table, main

SAVES = 2


def _rank(rep: int, cpu: dict[str, float], wall: dict[str, float]) -> list[dict]:
    """One rank's runs of one repetition: `cpu` / `wall` are each competitor's totals over the loop."""
    out = []
    for name in COMPETITORS:
        if name == "nvrx":
            out.append(asdict(Measured(name=name, rep=rep, available=False, reason="no GPU")))
            continue
        saves = 0 if name == "none" else SAVES
        m = Measured(
            name=name,
            rep=rep,
            wall_s=wall[name],
            stalls_s=[0.5 if name == "sync" else 0.01] * saves,
            step_s=[1.0] * 3,
            overlapped=[False] * 3,
            cpu_s=cpu[name],
        )
        out.append(asdict(m))
    return out


def _ranks(reps: list[tuple[dict[str, float], dict[str, float]]]) -> list[dict]:
    results = [m for rep, (cpu, wall) in enumerate(reps) for m in _rank(rep, cpu, wall)]
    return [{"ckpt_bytes": 100, "reps": len(reps), "results": results} for _ in range(2)]


def test_each_figure_is_the_median_over_repetitions_with_its_spread() -> None:
    base = {"none": 10.0, "sync": 12.0, "dcp_thread": 11.0, "dcp_staging": 11.5, "kit": 10.5}
    reps = []
    for kit_cpu in (10.4, 10.8, 10.6):  # kit's extra CPU per save, both ranks: 0.4, 0.8, 0.6
        cpu = {**base, "kit": kit_cpu}
        reps.append((cpu, base))
    rows, result = _summarize_reps(_ranks(reps))
    assert set(result) == set(RESULT_KEYS)
    # dcp_thread is the cheaper dcp.async_save in CPU: 1.0 s extra on each of 2 ranks over 2 saves = 1.0/save
    median, low, high = result["cpu_ratio"]
    assert (median, low, high) == pytest.approx((0.6, 0.4, 0.8))
    kit = next(r for r in rows if r["name"] == "kit")
    assert (kit["extra_cpu_per_save_s"], kit["extra_cpu_per_save_s_min"]) == pytest.approx((0.6, 0.4))
    assert result["cost_ratio"] == pytest.approx([0.25, 0.25, 0.25])  # 0.5 s extra wall vs sync's 2.0 s
    table = _table(rows, {"ckpt_mb": 1, "step_s": 1, "sync_s": 1, "interval": 1, "steps": 3, "reps": 3})
    assert "3 repetition(s) (median (min-max) over them)" in table
    assert "| kit | 0.010 (0.010-0.010) |" in table


def test_a_ratio_over_no_difference_is_left_out_of_the_median() -> None:
    base = {"none": 10.0, "sync": 12.0, "dcp_thread": 11.0, "dcp_staging": 11.5, "kit": 10.5}
    flat = {**base, "sync": 10.0}  # a loaded machine: sync's extra wall came out 0
    _, result = _summarize_reps(_ranks([(base, base), (base, flat), (base, base)]))
    assert result["cost_ratio"] == pytest.approx([0.25, 0.25, 0.25])


def _run_json(tmp_path: Path, name: str, **medians: float) -> str:
    result = {k: [medians.get(k, 0.5), 0.0, 1.0] for k in RESULT_KEYS}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"result": result}))
    return str(path)


def test_check_stability_passes_runs_within_ten_percent_and_names_the_figure_that_is_not(
    tmp_path: Path, capsys
) -> None:
    steady = [_run_json(tmp_path, f"s{i}", cost_ratio=c) for i, c in enumerate((0.30, 0.32, 0.31))]
    assert main(["--check-stability", *steady]) == 0
    assert "stable: yes across 3 runs" in capsys.readouterr().out
    drifting = [*steady[:2], _run_json(tmp_path, "d", cost_ratio=0.40)]
    assert main(["--check-stability", *drifting]) == 1
    out = capsys.readouterr().out
    assert "stable: no (cost_ratio)" in out
    assert "cpu_ratio              0.5, 0.5, 0.5" in out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--check-stability", steady[0], str(tmp_path / "bad.json")]) == 2
    assert "bad.json is not a bench.checkpoint --json file" in capsys.readouterr().err
