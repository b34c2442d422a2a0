"""The `parallel` section (FSDP or HSDP) resolved on a job's shape, and the live-replica restore's agreement:
which step every rank resumes at, and who sends to whom (fsdpkit.resilience.parallel, replica, inprocess)."""

from __future__ import annotations

import pytest

from fsdpkit.resilience import ConfigError, MeshLayout, ParallelConfig, load_config
from fsdpkit.resilience.parallel import LayoutError, resolve_layout, shard_candidates
from fsdpkit.resilience.recovery import Report, agree, report_from_json, report_to_json
from fsdpkit.resilience.replica import ReplicaPlan, plan


def _resolve(replicate, shard="auto", *, world=16, node=8, fits=None) -> MeshLayout:
    return resolve_layout(
        ParallelConfig(replicate=replicate, shard=shard), world_size=world, ranks_per_node=node, fits=fits
    )


def test_the_default_is_fsdp_over_every_rank_and_replicas_split_the_rest() -> None:
    assert _resolve(1) == MeshLayout(1, 16)
    assert _resolve(2) == MeshLayout(2, 8)
    assert _resolve("auto", 4) == MeshLayout(4, 4)
    assert _resolve(4, 4) == MeshLayout(4, 4)
    assert _resolve(2).holders(3) == [3, 11] and _resolve(2).replica_of(11) == 1


def test_auto_takes_the_smallest_shard_group_the_plan_fits_and_never_splits_a_node() -> None:
    assert shard_candidates(32, 8) == [1, 2, 4, 8, 16, 32]
    asked: list[int] = []

    def fits(shard: int) -> bool:
        asked.append(shard)
        return shard >= 4

    assert _resolve("auto", world=32, fits=fits) == MeshLayout(8, 4)
    assert asked == [1, 2, 4], "smallest first, stops at the first that fits"
    assert _resolve("auto", world=32, fits=lambda s: s >= 16) == MeshLayout(2, 16), "whole nodes"
    assert _resolve("auto", world=32, fits=lambda s: False) == MeshLayout(1, 32)
    assert _resolve("auto", world=32) == MeshLayout(4, 8), "no plan: one node per shard group"


@pytest.mark.parametrize(
    ("replicate", "shard", "says"),
    [
        (3, "auto", "parallel.replicate=3 does not divide the world size 16"),
        (2, 4, "2 x parallel.shard=4 = 8, but the world size is 16: set one of them to auto"),
        ("auto", 12, "parallel.shard=12 does not divide the world size 16: pick one of 1, 2, 4, 8, 16"),
        ("auto", 3, "parallel.shard=3 does not divide"),
    ],
)
def test_a_layout_that_does_not_fit_the_job_is_one_line_with_the_choices(replicate, shard, says) -> None:
    with pytest.raises(LayoutError, match=says.replace("(", r"\(").replace(")", r"\)")):
        _resolve(replicate, shard)


def test_a_shard_group_that_splits_a_node_is_refused() -> None:
    with pytest.raises(LayoutError, match="would split a node's 8 ranks"):
        _resolve("auto", 12, world=24)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "nan", ""])
def test_bad_values_fail_at_load_in_one_line(value: str) -> None:
    with pytest.raises(
        ConfigError, match=r"parallel\.replicate must be (an integer >= 1 or auto|int \| auto)"
    ):
        load_config(["--run.id", "x", "--parallel.replicate", value], env={"WORLD_SIZE": "4"})


def test_the_layout_is_checked_against_the_world_before_any_group() -> None:
    env = {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "6"}
    with pytest.raises(ConfigError, match=r"parallel\.replicate=4 does not divide the world size 6"):
        load_config(["--run.id", "x", "--parallel.replicate", "4"], env=env)
    cfg = load_config(["--run.id", "x", "--parallel.replicate", "3"], env=env)
    assert cfg.parallel.resolve(world_size=6, ranks_per_node=6) == MeshLayout(3, 2)


def test_the_replica_plan_resumes_at_the_highest_completed_step_when_every_shard_has_it() -> None:
    # 2 replicas x 2: rank 1 torn mid-update of step 5, its replica (rank 3) completed it
    found = plan([5, None, 5, 5], [True] * 4, replicate=2)
    assert found == ReplicaPlan(5, ((1, 3),))
    # a rank still before its update (clean at 4) catches up from its replica too
    assert plan([5, 4, 5, 5], [True] * 4, replicate=2) == ReplicaPlan(5, ((1, 3),))
    # 3 replicas: the nearest following replica sends, which spreads senders
    assert plan([7, 7, None, None, 7, 7], [True] * 6, replicate=3) == ReplicaPlan(7, ((2, 4), (3, 5)))


@pytest.mark.parametrize(
    ("lives", "portable", "replicate", "says"),
    [
        (
            [5, None, 5, None],
            [True] * 4,
            2,
            "no replica of shard 1 completed step 5 (rank 1: torn or lost, rank 3",
        ),
        ([5, 6, 5, 5], [True] * 4, 2, "no replica of shard 0 completed step 6"),
        ([5, None, 5, 5], [True, True, False, True], 2, "ranks [2] keep per-rank state"),
        ([5, None], [True, True], 1, "no live replica (parallel.replicate=1)"),
        ([None, None, None, None], [True] * 4, 2, "no rank's live state is clean"),
    ],
)
def test_without_a_complete_replica_of_every_shard_there_is_no_replica_plan(
    lives, portable, replicate, says
) -> None:
    found = plan(lives, portable, replicate=replicate)
    assert isinstance(found, str) and says in found, found


def _report(live, memory=3, why=None, portable=True) -> Report:
    return Report(live=live, why=why or (None if live is not None else "failed mid-update"), memory=memory,
                  portable=portable)  # fmt: skip


def test_the_agreement_falls_back_from_replica_to_memory_saying_why() -> None:
    reports = [_report(5, committed) for committed in (3, 3, 3, 3)]
    assert agree(reports, interval=3, replicate=2).source == "live"
    torn = [_report(5), _report(None), _report(5), _report(5)]
    chosen = agree(torn, interval=3, replicate=2)
    assert (chosen.source, chosen.step, chosen.replica) == ("replica", 5, ReplicaPlan(5, ((1, 3),)))
    both = [_report(5), _report(None), _report(5), _report(None)]
    fallback = agree(both, interval=3, replicate=2)
    assert (fallback.source, fallback.step) == ("memory", 3)
    assert "no replica of shard 1 completed step 5" in fallback.why
    assert agree(torn, interval=3, replicate=1).source == "memory", "FSDP: no replica to ask"


def test_a_report_carries_whether_its_state_is_portable_and_refuses_a_wrong_type() -> None:
    report = _report(4, portable=False)
    assert report_from_json(report_to_json(report)) == report
    with pytest.raises(ValueError, match="portable"):
        report_from_json(report_to_json(report).replace(b'"portable":false', b'"portable":1'))
