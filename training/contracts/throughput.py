"""Tokens per second per GPU and model FLOPs utilisation (MFU), the first figures a training team looks at.

FLOPs per token as torchtitan counts them (torchtitan/models/utils.py `get_dense_model_nparams_and_flops`,
after PaLM, arXiv:2204.02311 appendix B): 6 x (parameters without the input embedding) for the matmuls of
forward and backward, plus 12 x layers x dim x seq_len for attention's scores and values. Activation
checkpointing's recompute is not counted: MFU measures useful work, so recomputing lowers it, as it should.
Peak dense bf16 FLOP/s per GPU from NVIDIA's datasheets; a device not in the table (a CPU, say) has no MFU.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

PEAK_BF16_FLOPS: dict[str, float] = {
    # name fragment (as torch.cuda.get_device_name reports it) -> dense bf16 tensor FLOP/s, from the
    # datasheets; torchtitan's torchtitan/tools/utils.py `get_peak_flops` uses the same figures.
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM5 (p5.48xlarge)
    "H200": 989e12,  # p5e / p5en
    "B200": 2.25e15,  # p6-b200
    "A100": 312e12,  # p4d / p4de
    "L40S": 362e12,
}
"""Longest fragment first wins, so "H100 PCIe" is not read as an SXM H100."""


def peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of the device called `device_name`, None if it is not in the table."""
    for fragment in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if fragment.lower() in device_name.lower():
            return PEAK_BF16_FLOPS[fragment]
    return None


def flops_per_token(*, params: int, vocab_size: int, dim: int, n_layers: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + 12 x layers x dim x seq_len."""
    return 6.0 * (params - vocab_size * dim) + 12.0 * n_layers * dim * seq_len


@dataclass(frozen=True)
class Throughput:
    """Figures of one step on one rank (one GPU)."""

    tokens_per_s: float
    mfu: float | None
    """Model FLOPs per second / the device's peak; None where the peak is unknown (CPU)."""


def measure(*, tokens: int, duration_s: float, flops_token: float, peak: float | None) -> Throughput:
    """Throughput of a step that processed `tokens` tokens on this rank in `duration_s` seconds."""
    rate = tokens / duration_s if duration_s > 0 else 0.0
    return Throughput(tokens_per_s=rate, mfu=rate * flops_token / peak if peak else None)
