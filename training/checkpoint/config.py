"""The `checkpoint` config section: validated once here, then trusted by the checkpointer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["off", "sync", "async"]
Backend = Literal["kit", "dcp", "nvrx"]
_MODES = ("off", "sync", "async")
_BACKENDS = ("kit", "dcp", "nvrx")


def nvrx_unavailable_reason() -> str | None:
    """Why NVRx's TorchAsyncCheckpoint cannot run in this process (it hard-wires CUDA), or None if it can."""
    import importlib.util

    import torch

    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        return "nvidia-resiliency-ext is not installed"
    if not torch.cuda.is_available():
        return "NVRx TorchAsyncCheckpoint needs CUDA and no CUDA device is available"
    return None


@dataclass(kw_only=True)
class CheckpointConfig:
    mode: Mode = "async"
    """off: never save; sync: the loop waits for every shard to be durable; async: the loop pays only for
    taking the state (a host copy runs in the background) and the write overlaps training."""
    interval: int = 100
    """Save every this many steps (>= 1): the most work a fault can lose, in steps."""
    keep: int = 3
    """Committed checkpoints to keep (>= 2; the newest may still be in flight or damaged)."""
    backend: Backend = "kit"
    """Async implementation: kit (own host staging + raw-bytes DCP writer, cheapest in CPU), dcp
    (PyTorch's dcp.async_save with async staging), nvrx (NVRx TorchAsyncCheckpoint; needs NVRx and CUDA)."""
    verify: Literal["checksum", "size"] = "checksum"
    """What resume checks before trusting a checkpoint: checksum (sizes and CRC32 of every file, recorded
    while writing) or size (sizes only, for very large checkpoints on slow storage)."""
    pg_timeout_s: float = 600.0
    """Timeout in seconds of the checkpoint's own gloo process group (a save whose peer died fails after
    this long instead of hanging the writer forever)."""

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"checkpoint.mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if self.backend not in _BACKENDS:
            raise ValueError(
                f"checkpoint.backend must be one of {', '.join(_BACKENDS)}, got {self.backend!r}"
            )
        if self.verify not in ("checksum", "size"):
            raise ValueError(f"checkpoint.verify must be checksum or size, got {self.verify!r}")
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1:
            raise ValueError(
                f"checkpoint.interval must be an integer >= 1 (steps between saves), got {self.interval!r}"
            )
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 2:
            raise ValueError(
                f"checkpoint.keep must be an integer >= 2, got {self.keep!r}: with 1 the only copy may be "
                "the one being written or a damaged one, so a fault could leave nothing to resume from; "
                "use 2 or more"
            )
        if self.mode == "async" and self.backend == "nvrx":
            reason = nvrx_unavailable_reason()
            if reason:
                raise ValueError(
                    f"checkpoint.backend nvrx cannot run here ({reason}): use --checkpoint.backend kit or dcp"
                )
        if not self.pg_timeout_s > 0:
            raise ValueError(f"checkpoint.pg_timeout_s must be > 0 seconds, got {self.pg_timeout_s!r}")
