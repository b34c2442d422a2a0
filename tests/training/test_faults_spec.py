"""Fault grammar, the study's seeded schedule, and the injector's once-per-run rule
(training/resilience/faults.py)."""

from __future__ import annotations

import threading
import time

import pytest

from fsdpkit.resilience.faults import (
    Fault,
    FaultConfig,
    FaultConfigError,
    FaultInjector,
    InjectedFault,
    parse_kinds,
    parse_spec,
    seeded_schedule,
)
from fsdpkit.runtime.events import EventLog, read_events


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", []),
        ("kill:step=20:rank=1", [Fault(kind="kill", rank=1, step=20)]),
        (
            "kill:step=20:rank=1, exception:step=45:rank=1",
            [Fault(kind="kill", rank=1, step=20), Fault(kind="exception", rank=1, step=45)],
        ),
        ("hang:time=2.5:rank=0", [Fault(kind="hang", rank=0, time_s=2.5)]),
        ("sigstop:rank=3:step=7", [Fault(kind="sigstop", rank=3, step=7)]),
        ("oom:step=1:rank=2", [Fault(kind="oom", rank=2, step=1)]),
    ],
)
def test_parse_spec_accepts_the_grammar(spec: str, expected: list[Fault]) -> None:
    assert parse_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "kil:step=1:rank=1",
            "fault 'kil:step=1:rank=1': unknown kind 'kil'; use one of kill, hang, sigstop",
        ),
        ("kill:step=0:rank=1", "step must be an integer >= 1, got '0'"),
        ("kill:step=1.5:rank=1", "step must be an integer >= 1, got '1.5'"),
        ("kill:rank=1", "give exactly one of step= or time="),
        ("kill:step=1:time=3:rank=1", "give exactly one of step= or time="),
        ("kill:step=1", "fault 'kill:step=1': no rank"),
        ("kill:step=1:rank=-1", "rank must be an integer >= 0, got '-1'"),
        ("kill:step=1:rank=1,", "item 2 is empty; remove the extra comma"),
        ("kill:foo=1:rank=1", "unknown field 'foo'"),
        ("kill:step:rank=1", "'step' is not NAME=VALUE"),
        ("kill:step=1:step=2:rank=1", "step given twice"),
        ("hang:time=0:rank=1", "time must be seconds > 0 after trainer start, got '0'"),
        ("hang:time=abc:rank=1", "time must be seconds > 0 after trainer start, got 'abc'"),
        ("hang:time=inf:rank=1", "time must be seconds > 0"),
    ],
)
def test_parse_spec_rejects_bad_items_with_the_fix(spec: str, message: str) -> None:
    with pytest.raises(FaultConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        parse_spec(spec)
    assert "\n" not in str(info.value)


def test_study_schedule_is_reproduced_exactly() -> None:
    faults = seeded_schedule(
        seed=42,
        count=5,
        kinds=parse_kinds("exception:0.6,hang:0.4"),
        after_step=10,
        max_steps=2000,
        world_size=16,
    )
    assert [f.step for f in faults] == [62, 239, 574, 1320, 1529]
    assert [f.rank for f in faults] == [4, 12, 12, 2, 1]
    # reference/seed-system.md §11: with exception,hang 0.6/0.4 fault #3 (step 574) is the hang
    assert [f.kind for f in faults] == ["exception", "exception", "hang", "exception", "exception"]
    only_exceptions = seeded_schedule(
        seed=42, count=5, kinds=parse_kinds("exception"), after_step=10, max_steps=2000, world_size=16
    )
    assert [(f.step, f.rank) for f in only_exceptions] == [(f.step, f.rank) for f in faults]


def test_schedule_never_targets_rank_zero_and_scales_down() -> None:
    cfg = FaultConfig(schedule_seed=7, schedule_count=5, schedule_after_step=2, schedule_kinds="kill,hang:2")
    plan = cfg.plan(world_size=2, max_steps=12)
    assert len(plan) == 5
    assert all(f.rank == 1 and 3 <= f.step <= 12 for f in plan)  # type: ignore[operator]
    assert plan == cfg.plan(world_size=2, max_steps=12)


@pytest.mark.parametrize(
    ("kwargs", "plan_args", "message"),
    [
        ({"schedule_seed": 1, "schedule_kinds": "kill:x"}, None, "weight of 'kill' must be a number > 0"),
        ({"schedule_seed": 1, "schedule_kinds": "boom"}, None, "unknown kind 'boom'"),
        ({"schedule_seed": 1, "schedule_count": 0}, None, "schedule_count must be >= 1, got 0"),
        ({"spec": "kill:step=3:rank=4"}, (2, 10), "targets rank 4 but the world size is 2"),
        ({"spec": "kill:step=30:rank=1"}, (2, 10), "after the last step \\(10\\) and would never fire"),
        ({"schedule_seed": 1, "schedule_count": 9}, (2, 12), "only 2 steps lie after"),
        ({"schedule_seed": 1}, (1, 100), "needs a world size >= 2"),
    ],
)
def test_config_errors_name_the_rule(kwargs: dict, plan_args: tuple[int, int] | None, message: str) -> None:
    with pytest.raises(FaultConfigError, match=message):
        cfg = FaultConfig(**kwargs)
        if plan_args is not None:
            cfg.plan(world_size=plan_args[0], max_steps=plan_args[1])


def test_exception_fires_once_per_run_even_in_a_new_process(tmp_path) -> None:
    cfg = FaultConfig(spec="exception:step=3:rank=1")
    events = EventLog(tmp_path, role="trainer", rank=1)
    injector = FaultInjector(cfg, rank=1, world_size=2, max_steps=5, events=events, run_dir=tmp_path)
    injector.maybe_inject(1)
    injector.maybe_inject(2)
    with pytest.raises(InjectedFault, match="exception:step=3:rank=1"):
        injector.maybe_inject(3)
    injector.maybe_inject(3)  # replayed after an in-process restart: no second fault
    again = FaultInjector(  # a restarted process
        cfg, rank=1, world_size=2, max_steps=5, events=events, run_dir=tmp_path
    )
    again.maybe_inject(3)
    other_rank = FaultInjector(
        cfg, rank=0, world_size=2, max_steps=5, events=EventLog(None, role="trainer", rank=0)
    )
    other_rank.maybe_inject(3)
    faults = [e for e in read_events(tmp_path) if e["kind"] == "fault"]
    assert [(e["fault"], e["step"], e["target_rank"]) for e in faults] == [("exception", 3, 1)]
    assert (tmp_path / "faults" / "exception-step3-rank1").exists()


def test_time_exception_takes_effect_at_the_next_step_boundary(tmp_path) -> None:
    events = EventLog(tmp_path, role="trainer", rank=0)
    injector = FaultInjector(
        FaultConfig(spec="exception:time=0.05:rank=0"), rank=0, world_size=1, max_steps=10**9, events=events
    )
    fired = threading.Event()
    deadline = time.monotonic() + 30
    step = 0
    while not fired.is_set() and time.monotonic() < deadline:
        step += 1
        try:
            injector.maybe_inject(step)
        except InjectedFault:
            fired.set()
    injector.close()
    assert fired.is_set()
    (fault,) = [e for e in read_events(tmp_path) if e["kind"] == "fault"]
    assert fault["step"] == step and fault["fault"] == "exception"
