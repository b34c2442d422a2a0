"""The arithmetic of `checkpoint.interval: auto` (Young/Daly, bounds, rounding, the write floor), the fault
count read from a run's events, and the bad config values of its fields."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.interval import (
    AutoInterval,
    RunHistory,
    blended_mtbf_s,
    choose,
    daly_s,
    interval_steps,
    young_s,
)
from fsdpkit.runtime.events import EventLog, read_events
from fsdpkit.trainer.config import ConfigError, load_config


def test_young_is_sqrt_2_cost_mtbf_and_daly_refines_it() -> None:
    assert young_s(10.0, 86400.0) == pytest.approx(math.sqrt(2 * 10 * 86400))  # 1314.5 s
    # Daly 2006, eq. (20): sqrt(2δM)[1 + (1/3)sqrt(δ/2M) + δ/18M] - δ, here δ = 10 s, M = 1 day
    expected = math.sqrt(2 * 10 * 86400) * (1 + math.sqrt(10 / (2 * 86400)) / 3 + 10 / (18 * 86400)) - 10
    assert daly_s(10.0, 86400.0) == pytest.approx(expected)
    assert abs(daly_s(10.0, 86400.0) - young_s(10.0, 86400.0)) < 0.01 * young_s(10.0, 86400.0)
    assert daly_s(300.0, 100.0) == 100.0, "delta >= 2M: checkpoint every M"
    assert daly_s(0.0, 100.0) == 0.0


def test_interval_rounds_to_whole_steps_within_bounds_and_above_the_write_floor() -> None:
    assert interval_steps(24.4, 2.0, 0, lo=1, hi=100) == 12
    assert interval_steps(25.0, 2.0, 0, lo=1, hi=100) == 13, "half up"
    assert interval_steps(0.1, 2.0, 0, lo=1, hi=100) == 1, "never 0"
    assert interval_steps(1000.0, 2.0, 0, lo=1, hi=100) == 100
    assert interval_steps(4.0, 2.0, 0, lo=10, hi=100) == 10
    assert interval_steps(4.0, 2.0, 7, lo=1, hi=100) == 7, "a save never comes due while one is written"
    assert interval_steps(4.0, 2.0, 700, lo=1, hi=100) == 100, "interval_max is the bound on lost work"


def test_choose_blends_the_prior_with_the_faults_seen() -> None:
    cfg = CheckpointConfig(interval="auto", mtbf_s=3600.0, interval_min=1, interval_max=10_000)
    assert blended_mtbf_s(3600.0, 0.0, 0) == 3600.0
    assert blended_mtbf_s(3600.0, 1800.0, 2) == 1800.0
    calm = choose(cfg, cost_s=2.0, step_s=0.5, write_steps=3, faults=0, exposure_s=0.0)
    assert calm.interval == round(daly_s(2.0, 3600.0) / 0.5)
    stormy = choose(cfg, cost_s=2.0, step_s=0.5, write_steps=3, faults=3, exposure_s=400.0)
    assert stormy.mtbf_s == 1000.0 and stormy.faults_seen == 3 and stormy.interval < calm.interval


def _events(run_dir: Path, name: str, lines: list[dict]) -> None:
    folder = run_dir / "events"
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(e) + "\n" for e in lines)
    (folder / name).write_text(text + '{"ts": 99, "kind": "st')  # a torn last line is skipped


def test_history_counts_every_session_after_the_first_except_after_a_clean_end(tmp_path: Path) -> None:
    a, b, c = ({"host": "h", "pid": pid} for pid in (1, 2, 3))
    _events(
        tmp_path,
        "trainer-rank0-h-1.jsonl",
        [
            {"ts": 10.0, "kind": "start", **a},
            {"ts": 11.0, "kind": "resume", **a},
            {"ts": 20.0, "kind": "end", **a},
        ],
    )  # a planned stop (stop_at): the next start is no fault
    _events(
        tmp_path,
        "trainer-rank0-h-2.jsonl",
        [
            {"ts": 30.0, "kind": "start", **b},
            {"ts": 31.0, "kind": "resume", **b},
            {
                "ts": 35.0,
                "kind": "interval",
                "interval": 7,
                "cost_s": 1.5,
                "step_s": 0.25,
                "write_steps": 2,
                **b,
            },
            {"ts": 36.0, "kind": "resume", **b},  # an in-process restart: fault 1
            {"ts": 40.0, "kind": "step", **b},
        ],
    )  # then killed
    _events(
        tmp_path, "trainer-rank0-h-3.jsonl", [{"ts": 50.0, "kind": "start", **c}]
    )  # fault 2, crashed early
    _events(tmp_path, "trainer-rank1-h-4.jsonl", [{"ts": 12.0, "kind": "resume"}])  # not rank 0: ignored
    history = RunHistory.read(tmp_path)
    assert history.faults == 3, "and the session starting now, after the crash"
    assert history.past_exposure_s == pytest.approx((20 - 10) + (40 - 30) + 0), "first to last whole line"
    assert history.last is not None and history.last["interval"] == 7
    assert RunHistory.read(tmp_path / "empty").faults == 0


def test_history_counts_no_fault_for_a_session_that_resumed_live(tmp_path: Path) -> None:
    a = {"host": "h", "pid": 1}
    _events(
        tmp_path,
        "trainer-rank0-h-1.jsonl",
        [
            {"ts": 10.0, "kind": "start", **a},
            {"ts": 11.0, "kind": "resume", "source": "none", **a},
            {"ts": 20.0, "kind": "resume", "source": "live", **a},  # in process, nothing rolled back
            {"ts": 30.0, "kind": "resume", "source": "memory", **a},  # a rollback to the host copy: a fault
            {"ts": 40.0, "kind": "resume", "source": "live", **a},
        ],
    )
    assert RunHistory.read(tmp_path).faults == 2, "the memory restore, and the session starting now"
    assert RunHistory.read(tmp_path, live=True).faults == 1, "the session starting now resumes live"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"interval": "sometimes"}, r"checkpoint\.interval must be an integer >= 1 \(steps between"),
        ({"interval_min": 0}, r"checkpoint\.interval_min must be an integer in \[1, 16777216\] \(steps\)"),
        ({"interval_max": 2**25}, r"checkpoint\.interval_max must be an integer in \[1, 16777216\]"),
        ({"interval_min": 50, "interval_max": 10}, r"interval_min \(50\) must be <= checkpoint\.interval_"),
        ({"mtbf_s": float("nan")}, r"checkpoint\.mtbf_s must be a finite number of seconds, got nan"),
        ({"mtbf_s": 0.0}, r"checkpoint\.mtbf_s must be > 0 and at most 604800 seconds \(a week\), got 0\.0"),
        ({"mtbf_s": 1e7}, r"checkpoint\.mtbf_s must be > 0 and at most 604800 seconds"),
    ],
)  # fmt: skip
def test_bad_auto_values_are_one_line_errors(fields: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        CheckpointConfig(**{"interval": "auto", **fields})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("soon", r"checkpoint\.interval must be int \| auto, got 'soon'"),
        ("2.5", r"checkpoint\.interval must be int \| auto, got '2\.5'"),
        ("0", r"checkpoint\.interval must be an integer >= 1 \(steps between saves\) or auto, got 0"),
    ],
)
def test_the_cli_takes_auto_or_a_whole_number(value: str, match: str) -> None:
    base = ["--run.id", "x", "--model.name", "tiny"]
    assert load_config([*base, "--checkpoint.interval", "auto"], env={}).checkpoint.auto
    assert load_config([*base, "--checkpoint.interval", "7"], env={}).checkpoint.interval == 7
    with pytest.raises(ConfigError, match=match):
        load_config([*base, "--checkpoint.interval", value], env={})
    with pytest.raises(ConfigError, match=r"checkpoint\.mtbf_s='inf': must be a finite number"):
        load_config([*base, "--checkpoint.mtbf_s", "inf"], env={})


def _observe(auto: AutoInterval, step: int, entered: float, left: float, **flags: bool) -> None:
    auto.observe(
        step, entered=entered, left=left, **{"saved": False, "busy": False, "writing": False, **flags}
    )


def test_a_save_costs_its_stall_plus_the_slowdown_of_the_steps_over_its_write(
    tmp_path: Path,
) -> None:
    cfg = CheckpointConfig(interval="auto", mtbf_s=3600.0, interval_min=2, interval_max=1000)
    events = EventLog(tmp_path, role="trainer", rank=0)
    auto = AutoInterval(cfg, run_dir=tmp_path, rank=0, events=events)
    assert auto.chosen == 2 and auto.proposal() == 2.0
    _observe(auto, 1, 0.0, 0.0)
    _observe(auto, 2, 1.0, 1.5, saved=True, writing=True)  # step 2: 1 s clean, then a 0.5 s stall
    _observe(auto, 3, 3.5, 3.5, busy=True, writing=True)  # 2 s: overlapped the write
    _observe(auto, 4, 5.0, 5.0, busy=True)  # 1.5 s: overlapped, the write ended in it
    assert auto.chosen == 2, "not settled until a step starts with the write over"
    _observe(auto, 5, 6.0, 6.0)  # 1 s clean: the save is fully measured
    # cost = 0.5 stall + (2 - 1) + (1.5 - 1) slow-down = 2 s; step 1 s; the write took 2 steps
    assert auto.chosen == round(daly_s(2.0, 3600.0) / 1.0) == 119
    events.close()
    (logged,) = [e for e in read_events(tmp_path) if e["kind"] == "interval" and e["reason"] == "measured"]
    assert (logged["cost_s"], logged["step_s"], logged["write_steps"]) == (2.0, 1.0, 2)
    assert (logged["previous"], logged["interval"], logged["step"]) == (2, 119, 5)

    again = AutoInterval(cfg, run_dir=tmp_path, rank=0, events=EventLog(None, role="trainer", rank=0))
    assert again.chosen == 119, "a new session starts from the last measured inputs"
    peer = AutoInterval(cfg, run_dir=tmp_path, rank=1, events=EventLog(None, role="trainer", rank=1))
    assert peer.proposal() == 0.0, "only rank 0's choice is summed into the all-reduce"
    peer.agree(119.0)
    assert peer.current(world_size=2) == 119


def test_a_save_that_waits_for_the_previous_write_raises_the_floor(tmp_path: Path) -> None:
    cfg = CheckpointConfig(interval="auto", mtbf_s=1.0, interval_min=1, interval_max=50)
    auto = AutoInterval(cfg, run_dir=tmp_path, rank=0, events=EventLog(None, role="trainer", rank=0))
    _observe(auto, 1, 0.0, 0.0)
    _observe(auto, 2, 1.0, 1.0)
    _observe(auto, 3, 2.0, 2.01, saved=True, writing=True)
    _observe(auto, 4, 3.0, 3.0, busy=True, writing=True)
    _observe(auto, 5, 4.0, 7.0, busy=True, saved=True, writing=True)  # due again: waited 3 s for the write
    assert auto.chosen == 3, "two steps over the write, plus the wait: a tiny optimum is floored at 3"
    with pytest.raises(RuntimeError, match="needs the interval agreed by train_step's all-reduce"):
        AutoInterval(cfg, run_dir=tmp_path, rank=1, events=EventLog(None, role="trainer", rank=1)).current(2)


def test_no_second_save_starts_before_the_first_is_measured_against_clean_steps(tmp_path: Path) -> None:
    """A 1-step floor with nothing measured: the first save comes at once, then rank 0 proposes interval_max
    until that save is weighed against two clean steps (else it would save at every step meanwhile)."""
    cfg = CheckpointConfig(interval="auto", mtbf_s=3600.0, interval_min=1, interval_max=500)
    auto = AutoInterval(cfg, run_dir=tmp_path, rank=0, events=EventLog(None, role="trainer", rank=0))
    assert auto.proposal() == 1.0, "nothing measured: the first save after interval_min steps"
    _observe(auto, 1, 0.0, 0.2, saved=True, writing=True)  # the session's first step saves
    assert auto.proposal() == 500.0, "no second save while the first is unmeasured"
    _observe(auto, 2, 1.2, 1.2, busy=True, writing=True)  # 1 s: overlapped
    _observe(auto, 3, 2.7, 2.7, busy=True)  # 1.5 s: overlapped, the write ended in it
    _observe(auto, 4, 3.2, 3.2)  # 0.5 s clean: one clean step is no baseline yet
    assert auto.proposal() == 500.0
    _observe(auto, 5, 3.7, 3.7)  # 0.5 s clean: measured
    # cost = 0.2 stall + (1 - 0.5) + (1.5 - 0.5) = 1.7 s against a 0.5 s step; the write took 2 steps
    assert auto.chosen == round(daly_s(1.7, 3600.0) / 0.5)
    assert auto.proposal() == float(auto.chosen)
