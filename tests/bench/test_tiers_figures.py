"""bench.tiers' arithmetic on hand-made events and figures: the loop period over whole save intervals, the
tiers' work per save, the shared-storage pacing derived from cdk.json, the p5 projection and the RESULT
line. The runs themselves are the benchmark's; the faults they inject are tested end to end in
tests/training/checkpoint/test_ckpt_tiers.py and tests/k8s/test_k8s_node_faults.py."""

from __future__ import annotations

import pytest

from bench import tiers
from fsdpkit.infra.sizing import CHECKPOINT_BYTES_PER_PARAM, CLIENT_MBPS


def _step(rank: int, step: int, ts: float) -> dict:
    return {"kind": "step", "rank": rank, "step": step, "ts": ts}


def test_the_period_spans_whole_save_intervals_of_rank_zero() -> None:
    events = [_step(0, s, 10.0 * s) for s in range(1, 31)] + [_step(1, 25, 0.0)]
    events.append(_step(0, 31, 1e6))  # after the last saved step (the final save's aftermath): left out
    assert tiers.loop_period(events, 10) == pytest.approx((300.0 - 100.0) / (30 - 10))  # steps 10 to 30
    assert tiers.loop_period([_step(0, 10, 1.0)], 10) is None  # one saved step: no interval


def test_the_steady_period_leaves_out_the_saves_that_allocate_the_tiers_memory() -> None:
    ends = {s: 10.0 * s + (50.0 if s > 10 else 0.0) + (20.0 if s > 20 else 0.0) for s in range(1, 51)}
    events = [_step(0, s, ts) for s, ts in ends.items()]  # the saves of steps 10 and 20 cost 50 s, 20 s
    assert tiers.loop_period(events, 10, warmup=2) == pytest.approx(10.0)  # steps 30 to 50
    assert tiers.loop_period(events, 10) == pytest.approx((ends[50] - ends[10]) / 40)
    assert tiers.loop_period(events, 10, warmup=4) is None  # only step 50 is left
    assert tiers.STEPS["steady"] >= (tiers.WARMUP_SAVES + 2) * tiers.STEADY_INTERVAL  # two warm intervals


def test_tier_work_is_rank_zeros_write_and_peer_seconds_per_save() -> None:
    events = [
        {"kind": "tier", "rank": 0, "step": 10, "phase": "write", "duration_s": 1.0},
        {"kind": "tier", "rank": 0, "step": 10, "phase": "peer", "duration_s": 3.0},
        {"kind": "tier", "rank": 0, "step": 20, "phase": "write", "duration_s": 2.0},
        {"kind": "tier", "rank": 0, "step": 20, "phase": "failed", "duration_s": 50.0},
        {"kind": "tier", "rank": 1, "step": 20, "phase": "peer", "duration_s": 9.0},
    ]
    assert tiers.tier_work(events) == pytest.approx((4.0 + 2.0) / 2)
    assert tiers.tier_work(events, warmup=1) == pytest.approx(2.0)  # step 20 only
    assert tiers.tier_work([]) is None


def test_shared_reads_are_paced_at_one_ranks_share_of_the_deployed_fsx() -> None:
    deployed = tiers._deployed()  # cdk.json as `make deploy` reads it
    aggregate = deployed.storage.storage_gib / 1024 * (deployed.storage.effective_throughput_per_tib or 0)
    assert 1000 < tiers.fsx_aggregate_mbps() == pytest.approx(aggregate)
    per_rank = min(aggregate / deployed.gpu.max_nodes, CLIENT_MBPS) / tiers.GPUS_PER_NODE
    assert tiers.shared_mib_s() == pytest.approx(per_rank * 1e6 / 2**20)


def test_the_projection_reads_each_rank_share_from_fsx_memory_and_a_peer() -> None:
    rows = tiers.projection(1000.0, fsx_mbps_total=2000.0)
    assert [(r.model, r.nodes) for r in rows] == [(m, n) for m, _, n in tiers.PROJECTED]
    for row, (_, params, nodes) in zip(rows, tiers.PROJECTED, strict=True):
        total_gb = params * CHECKPOINT_BYTES_PER_PARAM / 1e9
        assert row.rank_gb == pytest.approx(total_gb / nodes / tiers.GPUS_PER_NODE)
        assert row.fsx_s == pytest.approx(total_gb * 1e3 / 2000.0)  # FSx, not the clients, is the bound
        assert row.memory_s == pytest.approx(row.rank_gb)  # 1 GB per second per rank
        assert row.peer_s == pytest.approx(row.rank_gb * 1e3 / tiers.PEER_FLOW_MBPS)  # slower than memory
    table = tiers.projection_table(rows)
    assert table.count("\n") == len(rows) + 1 and "Llama-3.1-70B | 128 |" in table


def test_the_result_line_gives_every_goal_figure_and_nan_for_a_missing_one() -> None:
    figures = {
        "restore_ratio": 0.1134,
        "shared_reads_on_restore": 0.0,
        "tier_stall_ratio": None,
        "tier_period_ratio": 1.2,
    }
    line = tiers.result_line(figures)
    assert line == (
        "RESULT restore_ratio=0.113 shared_reads_on_restore=0 tier_stall_ratio=nan tier_period_ratio=1.200"
    )
