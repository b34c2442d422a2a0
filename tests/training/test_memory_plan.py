"""The memory plan: fits and refusals for the study's model on p5, its fixes, and its error against the real
trainer's measured peak memory on CPU (bench.trainer's measurement, in-process figures from /proc)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from trainer_helpers import run_cli

from bench.trainer import measure, planned
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.trainer.memory_plan import GIB, MemoryPlanError, plan, refusal

LLAMA = MODEL_CONFIGS["llama3.1-8b"]
H100 = 81559 << 20
P5 = {
    "ranks_per_node": 8,
    "micro_batch": 1,
    "device_capacity": H100,
    "host_capacity": 1800 * GIB,
    "on_gpu": True,
}


def test_shapes_count_the_built_models_parameters():
    """The plan's parameter counts are the real module's: build each small shape on the meta device."""
    import torch

    from fsdpkit.trainer.model import Transformer

    for name in ("tiny", "small", "llama3.1-8b", "llama3.1-70b"):
        args = MODEL_CONFIGS[name]
        with torch.device("meta"):
            model = Transformer(args)
        assert sum(p.numel() for p in model.parameters()) == args.num_params(), name
        assert sum(p.numel() for p in model.layers[0].parameters()) == args.block_params, name


@pytest.mark.parametrize("nodes", [2, 4, 16])
def test_llama_8b_at_8k_needs_activation_checkpointing_on_p5(nodes):
    job = P5 | {"seq_len": 8192}
    sizes = {ac: plan(LLAMA, world_size=8 * nodes, ac=ac, **job) for ac in ("none", "selective", "full")}
    assert not sizes["none"].fits and sizes["full"].fits
    assert sizes["full"].activations < sizes["selective"].activations < sizes["none"].activations
    assert sizes["full"].device_total < sizes["selective"].device_total < sizes["none"].device_total


def test_more_nodes_shrink_the_state_not_the_activations():
    two, sixteen = (plan(LLAMA, world_size=8 * n, seq_len=8192, ac="full", **P5) for n in (2, 16))
    assert sixteen.params * 8 == pytest.approx(two.params, rel=1e-6)
    assert sixteen.activations == two.activations


def test_every_fix_the_refusal_names_makes_the_job_fit():
    job = P5 | {"seq_len": 8192, "ac": "none"}
    line = refusal(LLAMA, nodes=2, **job)
    assert line and "\n" not in line and "per GPU" in line
    assert "model.activation_checkpointing=selective" in line and "data.seq_len=4096" in line
    assert plan(LLAMA, world_size=16, **(job | {"ac": "selective"})).fits
    assert plan(LLAMA, world_size=16, **(job | {"seq_len": 4096})).fits
    assert refusal(LLAMA, nodes=2, **(job | {"ac": "full"})) is None


def test_a_job_no_change_can_fit_says_so():
    line = refusal(
        LLAMA,
        nodes=1,
        **(P5 | {"ranks_per_node": 1, "device_capacity": 24 * GIB, "seq_len": 8192, "ac": "full"}),
    )
    assert "no change of" in line


def test_host_staging_beyond_the_node_is_refused_with_more_nodes():
    job = P5 | {"host_capacity": 64 * GIB, "seq_len": 4096, "ac": "full"}
    line = refusal(LLAMA, nodes=1, **job)
    assert line.startswith("checkpoint staging (89.7 GiB) and memory tiers (off: 0.0 GiB) need 89.7 GiB")
    assert line.endswith("use 2 nodes")


def test_memory_tiers_count_in_the_host_plan_and_a_smaller_tier_is_offered():
    """2 nodes of the 8B: 44.9 GiB staged per node; peer tiers hold 4 such shares (the kept step and the
    one being written, own and buddy's), 2 with local, 3 more per extra kept step."""
    job = P5 | {"seq_len": 4096, "ac": "full"}
    sizes = {t: plan(LLAMA, world_size=16, tiers=t, **job) for t in ("off", "local", "peer")}
    share = sizes["off"].host_staging_per_node
    assert share / GIB == pytest.approx(44.87, abs=0.01)
    assert [sizes[t].host_tiers_per_node for t in ("off", "local", "peer")] == [0, 2 * share, 4 * share]
    assert plan(LLAMA, world_size=16, tiers="peer", tier_keep=2, **job).host_tiers_per_node == 6 * share
    tight = job | {"host_capacity": 160 * GIB, "tiers": "peer"}  # 5 shares do not fit, 3 do
    line = refusal(LLAMA, nodes=2, **tight)
    assert line.startswith("checkpoint staging (44.9 GiB) and memory tiers (peer: 179.5 GiB) need 224.4 GiB")
    assert "use checkpoint.tiers=local, or 4 nodes" in line


def test_nonsense_sizes_are_refused():
    with pytest.raises(MemoryPlanError, match="world_size=0"):
        plan(LLAMA, world_size=0, seq_len=8192, ac="full", **P5)


def test_plan_is_a_frozen_value():
    p = plan(LLAMA, world_size=16, seq_len=8192, ac="full", **P5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.params = 0  # type: ignore[misc]


@pytest.mark.slow
def test_plan_matches_the_trainers_measured_peak_within_15_percent(tmp_path: Path):
    """Real trainer session on 2 ranks; full activation checkpointing must also cut activation memory."""
    shape = {"model": "tiny", "seq_len": 512, "batch": 4}
    got = {ac: measure(ac, steps=1, workdir=tmp_path, **shape) for ac in ("none", "full")}
    for ac, m in got.items():
        estimate = planned(ac, **shape)
        assert abs(estimate - m["peak"]) / m["peak"] <= 0.15, (ac, estimate, m["peak"])
    assert got["full"]["activation"] < 0.7 * got["none"]["activation"]


@pytest.mark.slow
def test_trainer_refuses_a_job_that_cannot_fit_before_any_process_group(tmp_path: Path):
    out = run_cli(tmp_path, ["--run.id", "big", "--run.root", str(tmp_path), "--model.name", "llama3.1-8b"])
    assert out.returncode == 78, out.stderr
    assert out.stderr.startswith("error: the job needs") and out.stderr.count("\n") == 1
    assert not (tmp_path / "big").exists()


@pytest.mark.slow
def test_trainer_prints_its_plan_at_start(tmp_path: Path):
    out = run_cli(
        tmp_path,
        ["--run.id", "p", "--run.root", str(tmp_path), "--model.name", "tiny", "--training.steps", "2",
         "--checkpoint.mode", "off", "--data.seq_len", "32"],
    ).check()  # fmt: skip
    assert "[trainer] memory plan: " in out.stdout and "activation_checkpointing=none" in out.stdout
