"""Throughput figures (tokens/s per GPU, MFU) and gradient accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import TINY, run_trainer

from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.contracts.throughput import flops_per_token, measure, peak_flops
from fsdpkit.runtime.events import read_events


def test_flops_per_token_of_llama_8b_at_8k_is_torchtitans():
    a = MODEL_CONFIGS["llama3.1-8b"]
    got = flops_per_token(params=a.num_params(), vocab_size=a.vocab_size, dim=a.dim, n_layers=a.n_layers,
                          seq_len=8192)  # fmt: skip
    dense = 6 * (a.num_params() - a.vocab_size * a.dim)
    assert got == dense + 12 * 32 * 4096 * 8192
    assert 57e9 < got < 59e9  # ~58 GFLOP per token


@pytest.mark.parametrize(
    ("name", "peak"),
    [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA A100-SXM4-80GB", 312e12),
     ("NVIDIA H200", 989e12), ("cpu", None), ("NVIDIA A10G", None)],
)  # fmt: skip
def test_peak_flops_by_device_name(name, peak):
    assert peak_flops(name) == peak


def test_mfu_is_model_flops_over_peak():
    t = measure(tokens=8192, duration_s=2.0, flops_token=58e9, peak=989e12)
    assert t.tokens_per_s == 4096 and t.mfu == pytest.approx(4096 * 58e9 / 989e12)
    assert measure(tokens=10, duration_s=1.0, flops_token=1.0, peak=None).mfu is None


@pytest.mark.slow
def test_gradient_accumulation_matches_the_larger_batch_and_steps_report_tokens(tmp_path: Path) -> None:
    """2 micro-batches of 2 see the same samples as one batch of 4: the same losses up to rounding (the
    models differ where Adam's first steps turn rounding-level gradients into full-size updates)."""
    losses = {}
    for accum, batch in ((2, "2"), (1, "4")):
        run = f"accum{accum}"
        args = [
            "--run.id", run, "--run.root", str(tmp_path / "runs"), *TINY, "--data.batch_size", batch,
            "--training.steps", "4", "--checkpoint.mode", "off", "--training.grad_accum_steps", str(accum),
        ]  # fmt: skip
        run_trainer(tmp_path, args).check()
        steps = [e for e in read_events(tmp_path / "runs" / run) if e["kind"] == "step" and e["rank"] == 0]
        losses[accum] = [e["loss"] for e in steps]
        if accum == 2:
            assert all(e["mfu"] is None for e in steps)  # CPU: no peak FLOP/s
            for e in steps:
                assert e["tokens_per_s"] == pytest.approx(2 * 2 * 64 / e["duration_s"])
    assert len(losses[1]) == 4
    assert losses[2] == pytest.approx(losses[1], rel=1e-4)
