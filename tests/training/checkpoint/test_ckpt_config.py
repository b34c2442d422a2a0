"""Bad `checkpoint` config values give one-line errors that name the field, the value and the fix."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from fsdpkit.resilience.checkpoint.config import CheckpointConfig


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"keep": 1}, r"checkpoint\.keep must be an integer >= 2, got 1: with 1 the only copy"),
        ({"keep": 0}, r"checkpoint\.keep must be an integer >= 2, got 0"),
        (
            {"interval": 0},
            r"checkpoint\.interval must be an integer >= 1 \(steps between saves\) or auto, got 0",
        ),
        ({"interval": 2.5}, r"checkpoint\.interval must be an integer >= 1 .*got 2\.5"),
        ({"mode": "sometimes"}, r"checkpoint\.mode must be one of off, sync, async, got 'sometimes'"),
        ({"backend": "s3"}, r"checkpoint\.backend must be one of kit, dcp, nvrx, got 's3'"),
        ({"verify": "none"}, r"checkpoint\.verify must be checksum or size, got 'none'"),
        ({"writer_priority": "low"}, r"checkpoint\.writer_priority must be idle or normal, got 'low'"),
        ({"pg_timeout_s": 0}, r"checkpoint\.pg_timeout_s must be > 0 seconds, got 0"),
    ],
)
def test_bad_values_are_one_line_errors(fields: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        CheckpointConfig(**fields)
    assert "\n" not in str(info.value)


def test_defaults_are_async_kit() -> None:
    cfg = CheckpointConfig()
    assert (cfg.mode, cfg.backend, cfg.keep >= 2, cfg.interval >= 1) == ("async", "kit", True, True)


@pytest.mark.skipif(
    importlib.util.find_spec("nvidia_resiliency_ext") is not None and torch.cuda.is_available(),
    reason="NVRx can run here",
)
def test_nvrx_backend_without_nvrx_or_cuda_says_why() -> None:
    with pytest.raises(ValueError, match=r"checkpoint\.backend nvrx cannot run here \(.+\): use") as info:
        CheckpointConfig(mode="async", backend="nvrx")
    assert "\n" not in str(info.value)


def test_nvrx_backend_is_not_checked_when_unused() -> None:
    assert CheckpointConfig(mode="sync", backend="nvrx").backend == "nvrx"
