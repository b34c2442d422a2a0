"""bench.replica's arithmetic on hand-made figures: the medians per case, the ratios, equal_on_disk and the
RESULT line. The runs are the benchmark's; their faults are tested end to end in
tests/training/test_trainer_hsdp.py (the crash rejoined in place, the torn update, bitwise on disk)."""

from __future__ import annotations

import pytest

from bench import replica
from bench.replica import Figures, Outcome


def _rep(crash_replica: float, crash_memory: float, *, equal: bool = True) -> list[Outcome]:
    return [
        Outcome("reference", Figures(step_s=1.2)),
        Outcome("fsdp", Figures(step_s=1.0)),
        Outcome(
            "replica", Figures(faults=2, lost_steps=1, crash_recovery_s=crash_replica), equal_on_disk=equal
        ),
        Outcome("memory", Figures(faults=1, lost_steps=2, shared_bytes=0, crash_recovery_s=crash_memory)),
        Outcome("node_replica", Figures(faults=1, crash_recovery_s=1.0), equal_on_disk=True),
        Outcome("node_memory", Figures(faults=1, lost_steps=1, crash_recovery_s=4.0)),
        Outcome("steady_tiers", Figures(period_s=1.05)),
        Outcome("steady_off", Figures(period_s=1.0)),
    ]


def test_the_figures_are_medians_per_case_and_their_ratios() -> None:
    s = replica.summarise(_rep(2.0, 8.0) + _rep(3.0, 6.0) + _rep(10.0, 7.0))
    assert (s["crash_replica_s"], s["crash_memory_s"], s["node_replica_s"], s["node_memory_s"]) == (
        3,
        7,
        1,
        4,
    )
    assert s["replica_vs_memory"] == pytest.approx((3.0 + 1.0) / (7.0 + 4.0)), "both faults, summed"
    assert s["hsdp_step_ratio"] == pytest.approx(1.2) and s["tier_period_ratio"] == pytest.approx(1.05)
    assert (s["lost_steps"], s["faults"], s["memory_lost_steps"], s["equal_on_disk"]) == (1, 3, 3, 1.0)
    assert replica.result_line(s) == (
        "RESULT lost_steps=1 shared_bytes=0 equal_on_disk=1 replica_vs_memory=0.364 hsdp_step_ratio=1.200 "
        "tier_period_ratio=1.050"
    )


def test_one_rep_that_differs_on_disk_makes_it_zero_and_a_failed_run_leaves_nan() -> None:
    s = replica.summarise(_rep(2.0, 8.0) + _rep(2.0, 8.0, equal=False))
    assert s["equal_on_disk"] == 0.0
    failed = [o if o.case != "memory" else Outcome("memory", None, note="exit 1") for o in _rep(2.0, 8.0)]
    s = replica.summarise(failed)
    assert s["replica_vs_memory"] is None and "replica_vs_memory=nan" in replica.result_line(s)
    unknown = replica.summarise([o for o in _rep(2.0, 8.0) if o.case not in replica.REPLICA_CASES])
    assert unknown["equal_on_disk"] is None and "equal_on_disk=nan" in replica.result_line(unknown)


def test_each_case_runs_the_job_it_says() -> None:
    crash = replica.Case("replica", "tiny")
    args = crash.trainer_args(replica.REPO, "x")
    assert args[args.index("--parallel.replicate") :][:2] == ["--parallel.replicate", "2"]
    assert f"kill:step={replica.CRASH_STEP}:rank=1" in args and crash.launcher_args() == [
        "--rank-restart",
        "in-place",
    ]
    assert crash.env() == {"KIT_FAULT_TEST_IN_UPDATE": f"exception:step={replica.TORN_STEP}:rank=3"}
    group = replica.Case("memory", "tiny")
    assert (
        group.launcher_args() == []
        and group.env() == {}
        and f"kill:step={replica.CRASH_STEP}:rank=1" in (group.trainer_args(replica.REPO, "x"))
    )
    fsdp = replica.Case("fsdp", "tiny").trainer_args(replica.REPO, "x")
    assert fsdp[fsdp.index("--parallel.replicate") + 1] == "1" and "--fault.spec" not in fsdp
    off = replica.Case("steady_off", "tiny").trainer_args(replica.REPO, "x")
    assert off[off.index("--checkpoint.tiers") + 1] == "off"
    node = replica.Case("node_replica", "tiny")
    assert node.local and f"FAULT_SPEC=node:step={replica.CRASH_STEP}:node=1" in node.values("x")
    assert "INPROCESS=true" in node.values("x") and "INPROCESS=false" in replica.Case(
        "node_memory", "t"
    ).values("x")
