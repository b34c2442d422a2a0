"""bench.scale's arithmetic on hand-made rows: the fitted growth exponent, the projection along it, the table
and the RESULT line. The runs themselves are the benchmark's (real store, real rendezvous handlers); the
handler's semantics (join, spare promotion, expiry, re-form, stable ranks) are tested with real stores in
tests/training/test_launch_spares_rdzv.py (c10d) and
tests/training/test_kit_rendezvous.py (kit)."""

from __future__ import annotations

import math

import pytest

from bench import scale


def _row(nodes: int, **figures: float) -> dict[str, float]:
    base = {
        "design": "kit",
        "nodes": nodes,
        "formation_s": 0.4,
        "store_cpu": 0.001 * nodes,
        "store_bytes_s": 1000.0 * nodes**2,
        "store_calls_s": 10.0 * nodes,
        "cas_s": 8.0 * nodes,
        "cas_failed": 0.5,
        "client_cpu_per_node": 0.003,
        "false_expiries": 0,
        "detect_s": 1.3,
        "reform_s": 0.1 * nodes**0.5,
    }
    return {**base, **figures}


def test_growth_is_the_log_log_slope() -> None:
    rows = [_row(n) for n in (4, 16, 64)]
    assert scale.growth(rows, "store_bytes_s") == pytest.approx(2.0)
    assert scale.growth(rows, "store_cpu") == pytest.approx(1.0)
    assert scale.growth(rows, "formation_s") == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(scale.growth(rows[:1], "store_cpu"))  # one point: no fit
    assert math.isnan(scale.growth([_row(4, detect_s=0.0)], "detect_s"))  # zeros are left out


def test_projection_extends_the_fit_from_the_largest_n() -> None:
    rows = [_row(n) for n in (4, 16, 64)]
    assert scale.project(rows, "store_bytes_s", 1088) == pytest.approx(1000.0 * 1088**2)
    noisy = [_row(4, store_cpu=0.004), _row(16, store_cpu=0.02), _row(64, store_cpu=0.05)]
    slope = scale.growth(noisy, "store_cpu")
    assert scale.project(noisy, "store_cpu", 128) == pytest.approx(0.05 * 2**slope)


def test_result_line_and_table() -> None:
    rows = [_row(64, false_expiries=1), _row(4), _row(16)]
    line = scale.result_line(rows)
    figures = dict(item.split("=") for item in line.removeprefix("RESULT ").split())
    assert figures["nodes_light_max"] == "64" and figures["false_expiries"] == "1"
    assert float(figures["store_bytes_growth"]) == pytest.approx(2.0)
    # detection (flat 1.3 s) + re-forming (0.1 N^0.5): the control plane's exponent is between 0 and 0.5
    assert 0 < float(figures["recovery_growth"]) < 0.5
    expected = 1.3 + 0.1 * 1024**0.5
    assert float(figures["projected_control_1024_s"]) == pytest.approx(expected, rel=0.15)
    text = scale.table(sorted(rows, key=lambda r: r["nodes"]))
    assert text.splitlines()[2].startswith("| kit | 4 | 0.40 | 0.004 | 0.02 |")
    assert len(text.splitlines()) == 5
    both = scale.result_line(rows + [_row(n, design="c10d", store_bytes_s=500.0 * n**1.5) for n in (4, 64)])
    figures = dict(item.split("=") for item in both.removeprefix("RESULT ").split())
    assert float(figures["store_bytes_growth"]) == pytest.approx(2.0)  # the kit's rows alone
    assert float(figures["c10d_store_bytes_growth"]) == pytest.approx(1.5)


def test_the_section_says_whether_the_design_holds_from_the_fitted_growth() -> None:
    quadratic = [_row(n, design="c10d") for n in (4, 16, 64)]
    linear = [_row(n, store_bytes_s=1000.0 * n) for n in (4, 16, 64)]
    text = scale.section(quadratic + linear, scale.result_line(quadratic + linear), "python -m bench.scale")
    kit, c10d = (line for line in text.splitlines() if line.startswith(("- **kit**", "- **c10d**")))
    assert "the design holds on this count" in kit and "does not hold at 1,024 nodes" in c10d


def _launchers(nodes: int, **figures: float) -> dict[str, float]:
    base = {
        "nodes": nodes,
        "startup_s": 2.0 * nodes,
        "startup_cpu_per_node": 3.5,
        "formation_s": 0.05 * nodes**0.25,
        "store_cpu": 0.001,
        "store_bytes_s": 500.0 * nodes,
        "machine_cpu_per_node": 0.015,
        "memory_mb_per_node": 110.0,
        "steps_s": 3.0,
        "false_restarts": 0,
        "false_expiries": 0,
        "beat_gap_max_s": 0.25 + 0.01 * nodes,
        "detect_s": 0.6,
        "reform_s": 1.4,
        "first_step_s": 1.4 + 0.03 * nodes,
        "event_cpu_per_node": 0.1,
    }
    return {**base, **figures}


def test_the_real_launchers_give_nodes_max_formation_growth_and_the_whole_recovery_projected() -> None:
    light = [_row(n) for n in (4, 16, 64)]
    real = [_launchers(n) for n in (16, 4, 32, 8)]
    real[0]["false_expiries"] = 2
    figures = dict(item.split("=") for item in scale.result_line(light, real).removeprefix("RESULT ").split())
    assert figures["nodes_max"] == "32" and figures["nodes_light_max"] == "64"
    assert float(figures["formation_growth"]) == pytest.approx(0.25)  # the real launchers' fit
    assert float(figures["light_formation_growth"]) == pytest.approx(0.0, abs=1e-9)
    assert figures["false_expiries"] == "2" and figures["beat_gap_max_s"] == "0.57"
    # the real launchers' whole recovery at 32, plus the control plane's growth from 32 to 1,024 along the
    # light fits (detection flat, re-forming 0.1 N^0.5)
    expected = (1.4 + 0.03 * 32) + 0.1 * (1024**0.5 - 32**0.5)
    assert float(figures["projected_recovery_1024_s"]) == pytest.approx(expected, abs=0.011)
    assert "projected_recovery_1024_s" not in scale.result_line([], real)  # no light fit: not projected
    text = scale.launchers_section(sorted(real, key=lambda r: r["nodes"]))
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 5 and rows[1].startswith("| 4 | 8.0 (3.5) | 0.071 |")
