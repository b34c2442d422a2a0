"""`mix`: a 63-bit seed that is a pure function of a seed and some integers (a sample index, an epoch, a
step and a rank), for generators that must draw the same numbers whenever the same thing is asked again."""

from __future__ import annotations

_GOLDEN = 0x9E3779B97F4A7C15


def mix(seed: int, *values: int) -> int:
    """A well-spread 63-bit value of (seed, *values) (torch.Generator.manual_seed takes it comfortably)."""
    h = seed & (2**64 - 1)
    for v in values:
        h = ((h ^ v) * _GOLDEN + 0x632BE59BD9B4E019) & (2**64 - 1)
    return h >> 1
