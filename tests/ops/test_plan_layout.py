"""The plan's HSDP side: the layouts a job allows, the recommended one (ops/plan/layout.py), a step's
communication on each link, and the replica mechanism of the goodput model (ops/plan/model.py), each
against a hand computation; `--replicate` through `make plan`'s command line."""

from __future__ import annotations

import json
import math

import pytest

from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.ops.plan.failures import FailureRates, PlanInputError
from fsdpkit.ops.plan.layout import (
    ACTIVATION_SHARE,
    DEVICE_BYTES,
    EFA_HOP_S,
    EFA_NODE_GBPS,
    GIB,
    NVLINK_GBPS,
    NVLINK_HOP_S,
    Layout,
    device_bytes,
    parse_replicate,
    recommend,
    shard_sizes,
    step_comm,
)
from fsdpkit.ops.plan.model import Job, evaluate, fallback_chance

SEVENTY = MODEL_CONFIGS["llama3.1-70b"]
TINY = MODEL_CONFIGS["tiny"]


def test_a_shard_group_lies_inside_a_node_or_spans_whole_nodes_that_divide_the_job() -> None:
    assert shard_sizes(1) == [1, 2, 4, 8]
    assert shard_sizes(6) == [1, 2, 4, 8, 16, 24, 48]
    assert Layout(nodes=6, replicate=2, shard=24).label == "HSDP 2 x 24 (shard group 3 nodes)"
    assert Layout(nodes=2, replicate=1, shard=16).label == "1-D FSDP over 16 GPUs"
    with pytest.raises(PlanInputError, match=r"layout 4 x 12 on 6 node\(s\): replicate x shard must be 48"):
        Layout(nodes=6, replicate=4, shard=12)  # 12 ranks: a node and a half


def test_the_recommendation_is_the_smallest_shard_group_whose_memory_fits_by_hand() -> None:
    """llama3.1-70b: 16 B per parameter over the group, bf16 root and two blocks plus a block's fp32
    gradients gathered, a 5 % reserve; a quarter of the GPU left for activations."""
    params = SEVENTY.num_params()
    gathered = 2 * SEVENTY.root_params + 8 * SEVENTY.block_params
    reserve = max(4 * GIB, DEVICE_BYTES // 20)
    for shard in (16, 32):
        assert device_bytes(SEVENTY, shard) == 16 * math.ceil(params / shard) + gathered + reserve
    budget = (1 - ACTIVATION_SHARE) * DEVICE_BYTES
    assert device_bytes(SEVENTY, 16) > budget >= device_bytes(SEVENTY, 32)
    layout = recommend(SEVENTY, 1024)
    assert (layout.replicate, layout.shard, layout.holders) == (256, 32, 255)
    assert layout.node_state_gb(params) == pytest.approx(12 * params / 32 * 8 / 1e9)
    small = recommend(MODEL_CONFIGS["llama3.1-8b"], 4)  # fits in 4 GPUs: 2 replicas in every node
    assert (small.replicate, small.shard, small.holders) == (8, 4, 3)
    # where no group fits, 1-D FSDP over every GPU
    assert recommend(SEVENTY, 1).shard == 8 and recommend(SEVENTY, 1).replicate == 1


def test_a_step_communicates_inside_the_shard_group_and_all_reduces_across_replicas_by_hand() -> None:
    """tiny on 2 nodes as 4 x 4: the group's gathers and reduce-scatter over NVLink, the gradient shard's
    all-reduce through each node's EFA (4 rings, one per shard index)."""
    p, units = TINY.num_params(), TINY.n_layers + 1
    comm = step_comm(Layout(nodes=2, replicate=4, shard=4), TINY)
    assert comm.nvlink_s == pytest.approx(3 / 4 * 8 * p / (NVLINK_GBPS * 1e9))
    assert comm.efa_s == pytest.approx(4 * 2 * 3 / 4 * 4 * p / 4 / (EFA_NODE_GBPS * 1e9))
    assert comm.latency_s == pytest.approx(units * 3 * 3 * NVLINK_HOP_S + units * 2 * 3 * EFA_HOP_S)
    flat = step_comm(Layout(nodes=2, replicate=1, shard=16), TINY)  # 1-D: everything over EFA
    assert flat.nvlink_s == 0 and flat.efa_s == pytest.approx(15 / 16 * 8 * p / (EFA_NODE_GBPS * 1e9))
    assert flat.latency_s == pytest.approx(units * 3 * 15 * EFA_HOP_S)


def test_at_1024_nodes_the_1d_rings_latency_makes_hsdp_the_faster_step() -> None:
    hsdp = step_comm(recommend(SEVENTY, 1024), SEVENTY)
    flat = step_comm(Layout(nodes=1024, replicate=1, shard=8192), SEVENTY)
    assert hsdp.efa_s > flat.efa_s  # more bytes over EFA: the replicas' all-reduce comes on top
    assert hsdp.total_s < flat.total_s / 4  # but 8,191 ring steps a collective cost 1-D far more


PER_HOUR = 1e-3
NODE_ONLY = FailureRates(soft=0.0, node=PER_HOUR, drain=0.0, source="test")


def _job(**change) -> Job:
    base = {
        "nodes": 64, "step_s": 2.0, "checkpoint_gb": 640.0, "shared_gbps": 20.0, "price_per_node_hour": 50.0,
        "spares": 3, "node_state_gb": 40.0, "holders": 1,
    }  # fmt: skip
    return Job(**{**base, **change})


def test_a_lost_node_with_a_live_replica_costs_the_transfer_and_half_a_step_by_hand() -> None:
    """Node losses only, R = 2 (one other holder): the replica path costs detection + re-forming + an
    in-place restart + 40 GB at 400 GB/s + a step, and throws away half a step; with the chance that the
    other holder is lost too in that window, the memory tiers' path (40 GB from the buddy at 25 GB/s) and
    the work since the last save."""
    job = _job()
    p = job.phases
    replica = p.node_detect_s + p.reform_s + p.inprocess_restart_s + 40.0 / 400.0 + 2.0
    tiers = p.node_detect_s + p.reform_s + 40.0 / 25.0 + 2.0
    fallback = 1 - math.exp(-PER_HOUR * replica / 3600)
    assert fallback_chance(job, NODE_ONLY, replica) == pytest.approx(fallback)
    out = evaluate("kit-replica", job, NODE_ONLY)
    lam = 64 * PER_HOUR / 3600
    stall, write = 10.0 / 50.0, 640.0 / 20.0  # a node's share of the save; the save's write
    tau = min(math.sqrt(2 * stall / (lam * fallback)), 3600.0)
    assert out.interval_s == pytest.approx(tau)
    down = (1 - fallback) * replica + fallback * tiers
    replay = fallback * (tau / 2 + write) + (1 - fallback) * 2.0 / 2
    spare = out.spare_available
    wait = (1 - spare) * p.replacement_s
    assert out.goodput == pytest.approx((1 - stall / tau) * (1 - lam * (down + wait + replay)))


def test_without_a_replica_the_replica_row_is_the_kits_own() -> None:
    job = _job(holders=0)
    for rates in (NODE_ONLY, FailureRates(soft=1e-4, node=2e-4, drain=1e-4, source="test")):
        assert evaluate("kit-replica", job, rates).goodput == pytest.approx(
            evaluate("kit", job, rates).goodput
        )
    assert fallback_chance(job, NODE_ONLY, 10.0) == 1.0


def test_more_holders_never_raise_the_fallback_and_a_replica_beats_the_tiers() -> None:
    chances = [fallback_chance(_job(holders=h), NODE_ONLY, 30.0) for h in (1, 2, 4, 63)]
    assert chances == sorted(chances, reverse=True) and chances[-1] < 1e-100
    assert evaluate("kit-replica", _job(), NODE_ONLY).goodput > evaluate("kit", _job(), NODE_ONLY).goodput
    with pytest.raises(PlanInputError, match=r"holders=64: give a whole number of other nodes, 0 to 63"):
        _job(holders=64)


@pytest.mark.parametrize(
    ("text", "value"), [("auto", "auto"), ("1", 1), ("256", 256)], ids=["auto", "one", "many"]
)
def test_replicate_accepts_auto_or_a_whole_number(text: str, value: int | str) -> None:
    assert parse_replicate(text) == value


def test_make_plan_shows_the_replica_mechanism_and_the_layout_it_assumes(capsys) -> None:
    from fsdpkit.ops.plan.__main__ import main

    assert main(["--nodes", "1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    layout = out["layout"]
    assert (layout["replicate"], layout["shard"]) == (256, 32) and layout["source"].startswith("auto")
    assert layout["hsdp_step_ratio"] < 1 and out["step_s"] == pytest.approx(
        max(layout["compute_s"], layout["comm_s"]["total_s"])
    )
    rows = {r["mechanism"]: r for r in out["mechanisms"]}
    assert rows["kit-replica"]["goodput"] > rows["kit"]["goodput"] > rows["torchrun"]["goodput"]
    assert main(["--nodes", "1024", "--replicate", "1", "--json"]) == 0
    flat = json.loads(capsys.readouterr().out)
    rows = {r["mechanism"]: r for r in flat["mechanisms"]}
    assert flat["layout"]["label"] == "1-D FSDP over 8,192 GPUs"
    assert rows["kit-replica"]["goodput"] == pytest.approx(rows["kit"]["goodput"])
    assert main(["--nodes", "1024"]) == 0
    text = capsys.readouterr().out
    assert "layout (every row): HSDP 256 x 32 (shard group 4 nodes)" in text
    assert "kit + live replica (HSDP)" in text and "212 GB from one of 255 other holder(s)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicate", "0"], "--replicate '0': give auto (the smallest shard group that fits) or a whole"),
        (["--replicate", "two"], "--replicate 'two': give auto"),
        (["--nodes", "16", "--replicate", "3"], "--replicate 3: give a divisor of the job's 128 GPUs whose"),
        (["--nodes", "3", "--replicate", "2"], "--replicate 2: give a divisor of the job's 24 GPUs"),
    ],
)
def test_make_plan_refuses_a_bad_replicate_in_one_line(argv: list[str], message: str, capsys) -> None:
    from fsdpkit.ops.plan.__main__ import main

    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and message in err[0], err
