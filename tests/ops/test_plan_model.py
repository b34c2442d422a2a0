"""The goodput model (ops/plan/model.py) against hand-computed cases, where it must be monotonic, and its
one-line refusals."""

from __future__ import annotations

import json
import math

import pytest

from fsdpkit.ops.plan.failures import LLAMA3, FailureRates, PlanInputError
from fsdpkit.ops.plan.model import (
    MECHANISMS,
    Job,
    PhaseTimes,
    evaluate,
    poisson_cdf,
    spares_needed,
    young_daly_s,
)

PER_HOUR = 1e-4


def _job(**change) -> Job:
    base = {
        "nodes": 100,
        "step_s": 2.0,
        "checkpoint_gb": 400.0,
        "shared_gbps": 40.0,
        "price_per_node_hour": 98.32,
    }
    return Job(**{**base, **change})


def test_young_daly_interval() -> None:
    assert young_daly_s(10.0, 3600.0) == pytest.approx(math.sqrt(72000.0))


def test_one_fault_class_under_a_kubernetes_restart_by_hand() -> None:
    """Node losses only: Lambda = 100 x 1e-4 / 3600 per s; a save's stall is the whole write (400/40 = 10 s);
    each loss costs 270 s + a restore of 10 s + one 2 s step + the replacement's 900 s + tau/2 of work."""
    rates = FailureRates(soft=0.0, node=PER_HOUR, drain=0.0, source="test")
    out = evaluate("torchrun", _job(), rates)
    lam = 100 * PER_HOUR / 3600.0
    tau = math.sqrt(2 * 10.0 / lam)
    assert out.interval_s == pytest.approx(tau)
    want = (1 - 10.0 / tau) * (1 - lam * (270.0 + 10.0 + 2.0 + 900.0 + tau / 2))
    assert out.goodput == pytest.approx(want)
    assert out.lost_per_day_s["waiting"] == pytest.approx(86400 * lam * 900.0)
    assert out.dollars_lost_per_day == pytest.approx((1 - want) * 100 * 98.32 * 24)


def test_soft_faults_only_cost_the_kit_its_in_process_restart() -> None:
    """Nothing throws work away: the interval is only bounded by the hour; each fault costs 10 s + a step."""
    rates = FailureRates(soft=PER_HOUR, node=0.0, drain=0.0, source="test")
    out = evaluate("kit", _job(), rates)
    lam = 100 * PER_HOUR / 3600.0
    stall = 4.0 / 50.0  # 4 GB per node through a 50 GB/s host copy
    assert out.interval_s == 3600.0 and out.lost_per_day_s["replay"] == 0.0
    assert out.goodput == pytest.approx((1 - stall / 3600.0) * (1 - lam * (10.0 + 2.0)))


def test_a_spare_takes_the_wait_away_unless_the_losses_outrun_the_replacements() -> None:
    rates = FailureRates(soft=0.0, node=PER_HOUR, drain=0.0, source="test")
    none, one = evaluate("kit", _job(spares=0), rates), evaluate("kit", _job(spares=1), rates)
    mu = 100 * PER_HOUR * 900.0 / 3600.0
    assert one.spare_available == pytest.approx(math.exp(-mu))  # no other loss waiting for its replacement
    assert none.spare_available == 0.0 and none.lost_per_day_s["waiting"] > one.lost_per_day_s["waiting"]


def test_spares_needed_against_a_poisson_tail_by_hand() -> None:
    """mu = 0.5 losses per replacement: P(X >= 3) = 1.44 % > 1 %, P(X >= 4) = 0.18 %: 4 spares."""
    rates = FailureRates(soft=0.0, node=0.5 / 100 / (900.0 / 3600.0), drain=0.0, source="test")
    assert spares_needed(_job(), rates, target=0.01) == 4
    assert 1 - poisson_cdf(2, 0.5) == pytest.approx(1 - math.exp(-0.5) * 1.625)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_more_nodes_never_raise_goodput_and_more_spares_never_lower_it(mechanism: str) -> None:
    sizes = [evaluate(mechanism, _job(nodes=n), LLAMA3).goodput for n in (16, 64, 256, 1024, 2048)]
    assert sizes == sorted(sizes, reverse=True)
    spares = [evaluate(mechanism, _job(nodes=1024, spares=s), LLAMA3).goodput for s in range(6)]
    assert spares == sorted(spares)


def test_the_kit_keeps_the_most_at_1024_nodes() -> None:
    goodput = {m: evaluate(m, _job(nodes=1024, spares=4), LLAMA3).goodput for m in MECHANISMS}
    assert goodput["kit"] == max(goodput.values()) and goodput["torchrun"] == min(goodput.values())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: _job(nodes=0), "nodes=0: give a whole number >= 1"),
        (lambda: _job(step_s=float("nan")), "step_s=nan: give a finite number > 0"),
        (lambda: _job(price_per_node_hour=0.0), "price_per_node_hour=0.0: give a finite number > 0"),
        (lambda: _job(spares=-1), "spares=-1: give a whole number >= 0"),
        (lambda: PhaseTimes(replacement_s=float("inf")), "replacement_s=inf: give a finite number >= 0"),
        (lambda: FailureRates(soft=-1.0, node=0.0, drain=0.0, source="x"), "failure rate soft=-1.0"),
        (lambda: FailureRates(soft=0.0, node=0.0, drain=0.0, source="x"), "failure rates are all 0"),
        (lambda: evaluate("slurm", _job(), LLAMA3), "mechanism 'slurm': use one of kit-replica, kit, kit-no"),
    ],
)
def test_bad_input_is_one_line(make, message: str) -> None:
    with pytest.raises(PlanInputError) as err:
        make()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_make_plan_prints_every_mechanism_as_json_and_draws_the_png(tmp_path, capsys) -> None:
    from fsdpkit.ops.plan.__main__ import main

    png = tmp_path / "plan.png"
    assert main(["--nodes", "1024", "--spares", "4", "--json", "--png", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 1024 and out["spares"] == 4 and out["model"] == "llama3.1-70b"
    assert out["checkpoint_gb"] == pytest.approx(12 * 70.553706496)
    rows = {r["mechanism"]: r for r in out["mechanisms"]}
    assert list(rows) == list(MECHANISMS)
    assert rows["kit"]["goodput"] >= 0.95 and rows["kit"]["goodput"] > rows["torchrun"]["goodput"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "0"], "argument --nodes: '0': must be at least 1"),
        (["--rate-node", "nan"], "argument --rate-node: 'nan': must be a finite number"),
        (["--price", "0"], "argument --price: '0'"),
        (["--model", "gpt5"], "model 'gpt5': use one of llama3.1-70b, llama3.1-8b, small, tiny or a Hugging"),
        (
            ["--model", "/etc/hostname"],
            "model folder /etc/hostname is a file: give the folder holding config.json",
        ),
        (["--nodes", "4", "--nodes", "8"], "argument --nodes: given more than once"),
        (["--png", "/dev/null/p.png"], "--png='/dev/null/p.png': '/dev/null' is a file"),
    ],
)
def test_make_plan_refuses_bad_input_in_one_line(argv: list[str], message: str, capsys) -> None:
    from fsdpkit.ops.plan.__main__ import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and message in err[0], err
