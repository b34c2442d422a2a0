"""bench.checkpoint's summary over repetitions (no benchmark is run here: the ranks' reports are built)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.checkpoint import (
    COMPETITORS,
    RESULT_KEYS,
    Measured,
    ThreadCpu,
    _paired_extra_wall,
    _summarize,
    _summarize_reps,
    _table,
    main,
)

SAVES = 2


def _rank(rep: int, cpu: dict[str, float], wall: dict[str, float]) -> list[dict]:
    """One rank's runs of one repetition: `cpu` is each competitor's save CPU, `wall` its loop stalls (s);
    the process CPU (cross-check) is 10 s more than the save CPU, `none`'s steps take 1 s."""
    out = []
    for name in COMPETITORS:
        if name == "nvrx":
            out.append(asdict(Measured(name=name, rep=rep, available=False, reason="no GPU")))
            continue
        saves = 0 if name == "none" else SAVES
        m = Measured(
            name=name,
            rep=rep,
            wall_s=3.0 + wall[name],
            loop_stall_s=wall[name],
            stalls_s=[0.5 if name == "sync" else 0.01] * saves,
            step_s=[1.0] * 3,
            overlapped=[False] * 3,
            cpu_s=10.0 + cpu[name],
            save_cpu_s=cpu[name],
        )
        out.append(asdict(m))
    return out


def _ranks(reps: list[tuple[dict[str, float], dict[str, float]]]) -> list[dict]:
    results = [m for rep, (cpu, wall) in enumerate(reps) for m in _rank(rep, cpu, wall)]
    return [{"ckpt_bytes": 100, "reps": len(reps), "results": results} for _ in range(2)]


CPU = {"none": 0.0, "sync": 2.0, "dcp_thread": 1.0, "dcp_staging": 1.5, "kit": 0.5}
WALL = {"none": 0.0, "sync": 2.0, "dcp_thread": 1.0, "dcp_staging": 1.5, "kit": 0.5}


def test_each_figure_is_the_median_over_repetitions_with_its_spread() -> None:
    reps = [({**CPU, "kit": kit_cpu}, WALL) for kit_cpu in (0.2, 0.4, 0.3)]  # per rank and run
    rows, result = _summarize_reps(_ranks(reps))
    assert set(result) == set(RESULT_KEYS)
    # dcp_thread is the cheaper dcp.async_save in CPU: 1.0 s on each of 2 ranks over 2 saves = 1.0 per save;
    # the kit's 0.2-0.4 s per rank and run = 0.2-0.4 per save
    median, low, high = result["cpu_ratio"]
    assert (median, low, high) == pytest.approx((0.3, 0.2, 0.4))
    kit = next(r for r in rows if r["name"] == "kit")
    assert (kit["save_cpu_per_save_s"], kit["save_cpu_per_save_s_min"]) == pytest.approx((0.3, 0.2))
    assert kit["extra_cpu_vs_none_per_save_s"] == pytest.approx(0.3)  # the cross-check agrees here
    assert result["cost_ratio"] == pytest.approx([0.25, 0.25, 0.25])  # 0.5 s paired extra vs sync's 2.0 s
    assert result["vs_dcp_async"] == pytest.approx([0.5, 0.5, 0.5])  # vs dcp_thread's 1.0 s
    table = _table(rows, {"ckpt_mb": 1, "step_s": 1, "sync_s": 1, "interval": 1, "steps": 3, "reps": 3})
    assert "3 repetition(s) (median (min-max) over them)" in table
    assert "| kit | 0.010 (0.010-0.010) |" in table
    assert "cross-check: extra wall s vs none run" in table


def test_a_ratio_over_no_difference_is_left_out_of_the_median() -> None:
    flat = {**WALL, "sync": 0.0}  # a sync whose paired extra came out 0
    _, result = _summarize_reps(_ranks([(CPU, WALL), (CPU, flat), (CPU, WALL)]))
    assert result["cost_ratio"] == pytest.approx([0.25, 0.25, 0.25])


def test_the_idle_checkpoint_group_charged_to_none_is_taken_off_every_competitor_per_step() -> None:
    cpu = {name: v + 0.03 for name, v in CPU.items()}  # 0.01 s per step of 3 on each rank, in every run
    rows, result = _summarize(_ranks([(cpu, WALL)]))
    get = {r["name"]: r for r in rows if r["available"]}
    assert get["none"]["save_cpu_per_save_s"] == pytest.approx(0.03)  # both ranks, over 2 saves' worth
    assert get["kit"]["save_cpu_per_save_s"] == pytest.approx(0.5)
    assert result["cpu_ratio"] == pytest.approx(0.5)


def test_paired_extra_wall_counts_stalls_overlapped_steps_over_the_base_and_the_drain() -> None:
    none = asdict(Measured(name="none", step_s=[9.0, 1.0, 1.2, 0.9], overlapped=[False] * 4))
    # Interval 1: every step after the first overlaps, so the base is none's median step (first left out)
    m = asdict(
        Measured(
            name="kit",
            step_s=[9.0, 1.5, 1.5, 1.5],
            overlapped=[False, True, True, True],
            loop_stall_s=0.25,
            drain_s=0.5,
        )
    )
    extra, own = _paired_extra_wall(m, none)
    assert (extra, own) == (pytest.approx(0.25 + 3 * 0.5 + 0.5), False)
    # Enough non-overlapped steps of its own: they give the base, whatever none's steps took
    m = asdict(
        Measured(
            name="kit",
            step_s=[9.0, 2.0, 2.0, 2.0, 2.5, 2.0, 2.5],
            overlapped=[False, False, False, False, True, False, True],
            loop_stall_s=0.25,
        )
    )
    extra, own = _paired_extra_wall(m, none)
    assert (extra, own) == (pytest.approx(0.25 + 2 * 0.5), True)


def test_thread_cpu_counts_the_threads_born_in_the_window_even_when_they_ended_and_not_the_others() -> None:
    """Real threads burning real CPU: the born one (ended before stop) is counted with its own CPU clock's
    figure, the one alive before the window is not, whatever either burned."""

    def burn(seconds: float, out: list[float]) -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < seconds:
            pass
        out.append(time.thread_time())

    old_done, go, old_out = threading.Event(), threading.Event(), []

    def old_thread() -> None:
        go.wait()
        burn(0.05, old_out)
        old_done.set()
        go.clear()
        go.wait()  # alive at stop()

    old = threading.Thread(target=old_thread, daemon=True)
    old.start()
    meter = ThreadCpu(also=set())
    go.set()
    born_out: list[float] = []
    born = threading.Thread(target=burn, args=(0.05, born_out))
    born.start()
    born.join()
    old_done.wait()
    cpu, _, lost = meter.stop()  # the born thread may still be listed for a moment after join()
    go.set()
    old.join()
    assert lost == 0
    assert cpu == pytest.approx(born_out[0], abs=0.005)


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
