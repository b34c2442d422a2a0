"""The `checkpoint` config section: validated once here, then trusted by the checkpointer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fsdpkit.contracts import defaults

Mode = Literal["off", "sync", "async"]
Backend = Literal["kit", "dcp", "nvrx"]
WriterPriority = Literal["idle", "normal"]
Tiers = Literal["auto", "peer", "local", "off"]
_MODES = ("off", "sync", "async")
_BACKENDS = ("kit", "dcp", "nvrx")
_WRITER_PRIORITIES = ("idle", "normal")
_TIERS = ("auto", "peer", "local", "off")
TIER_KEEP_MAX = 8
"""Most memory-tier steps kept per node: each one is the node's whole share of the state, twice with peers."""
_WEEK_S = 7 * 24 * 3600.0
"""Ceiling of every duration (`*_s`), as fsdpkit.trainer.config.MAX_SECONDS (which imports this module)."""
INTERVAL_CAP = 2**24
"""Largest interval_max: the chosen interval travels in a float32 all-reduce, exact up to 2**24."""


def nvrx_unavailable_reason() -> str | None:
    """Why NVRx's TorchAsyncCheckpoint cannot run in this process (it hard-wires CUDA), or None if it can."""
    import importlib.util

    import torch

    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        return "nvidia-resiliency-ext is not installed"
    if not torch.cuda.is_available():
        return "NVRx TorchAsyncCheckpoint needs CUDA and no CUDA device is available"
    return None


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    mode: Mode = "async"
    """off: never save; sync: the loop waits for every shard to be durable; async: the loop pays only for
    taking the state (a host copy runs in the background) and the write overlaps training."""
    interval: int | Literal["auto"] = defaults.CHECKPOINT_INTERVAL
    """Save every this many steps (an integer >= 1: the most work a fault can lose, in steps), or `auto`: the
    interval is chosen from what the run measures (the cost of one save, the step time, the faults seen),
    Young/Daly's optimum, re-evaluated after every save within [interval_min, interval_max] and logged
    (`interval` events) when it changes; see docs/checkpointing.md "Choosing the interval"."""
    mtbf_s: float = 86400.0
    """auto only: the job's expected mean time between failures, seconds (> 0, at most a week). The run's own
    faults refine it: MTBF = (mtbf_s + seconds run) / (1 + faults seen). Default one day, for a small p5
    job: Llama 3 saw 419 unexpected interruptions in 54 days on 2,048 8-GPU nodes (~6,300 node-hours per
    node, i.e. ~16 days for 16 nodes), but small jobs also meet node repairs, capacity-block ends and
    software faults; a day errs towards saving more often, and the interval grows only as sqrt(MTBF)."""
    interval_min: int = 10
    """auto only: fewest steps between saves (>= 1); also the steps before the first save (no second one
    starts until that one is measured)."""
    interval_max: int = 1000
    """auto only: most steps between saves (>= interval_min): your bound on lost work, which wins over the
    measured optimum and over the steps one background write takes."""
    keep: int = 3
    """Committed checkpoints to keep (>= 2; the newest may still be in flight or damaged)."""
    backend: Backend = "kit"
    """Async implementation: kit (own host staging + raw-bytes DCP writer, cheapest in CPU), dcp
    (PyTorch's dcp.async_save with async staging), nvrx (NVRx TorchAsyncCheckpoint; needs NVRx and CUDA)."""
    verify: Literal["checksum", "size"] = "checksum"
    """What resume checks before trusting a checkpoint: checksum (sizes and CRC-32C of every file, recorded
    while writing) or size (sizes only, for very large checkpoints on slow storage)."""
    direct_io: bool = True
    """kit backend: write shards with O_DIRECT (from page-aligned host buffers, skipping the page cache,
    which cut a save's own CPU about 4x on the test machine: docs/checkpointing.md) where the file system
    takes it, else through the page cache on its own. false: always through the page cache (a file system
    whose O_DIRECT is slow, e.g. some NFS mounts)."""
    writer_priority: WriterPriority = "normal"
    """async: the scheduling class of the background writer thread. normal: the training threads' class.
    idle (Linux SCHED_IDLE): the writer runs only on CPU time that normal threads leave; on a node that does
    nothing but train and whose cores are all busy, steps beside a write slow down less (the tiny model's
    slow steps fell ~40 %, goodput +1-2 points, on the 2-core test machine), but beside other CPU-bound
    processes (data loader workers that fill every core, a laptop's other work) the writer starves and the
    loop waits for it at the next save (a 6-step test: 75-112 s against 24-27 s); see docs/checkpointing.md.
    A thread cannot leave the idle class again without CAP_SYS_NICE. Elsewhere than Linux: normal."""
    tiers: Tiers = "auto"
    """Memory tiers, read before shared storage when a worker or a node is replaced (docs/checkpointing.md,
    "Memory tiers"). local: each rank's last committed state also stays in its node's memory (/dev/shm,
    owned by the kit launcher), so a restarted worker restores from memory; peer: local, plus a copy on
    the buddy node (the next node in a ring), so a lost node's replacement gets its state from the buddy;
    off: every restore reads shared storage. auto (default): peer where it can be (the kit launcher, the
    kit writer, two nodes or more), else local, else off, said once at start."""
    tier_keep: int = 1
    """Committed steps each node keeps in its memory tier (1 to 8): restores only ever read the newest
    committed step; more copies only cost host memory (the memory plan counts them)."""
    shared_read_mib_s: float = 0.0
    """For benchmarks: cap this process's reads from shared storage at this many MiB/s (0: no cap), to emulate
    a file system shared by many nodes (e.g. FSx for Lustre's throughput divided over the nodes restoring
    at once) on a machine where every read comes from the page cache. Reads are counted either way."""
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
        if self.writer_priority not in _WRITER_PRIORITIES:
            raise ValueError(
                f"checkpoint.writer_priority must be idle or normal, got {self.writer_priority!r}"
            )
        if self.verify not in ("checksum", "size"):
            raise ValueError(f"checkpoint.verify must be checksum or size, got {self.verify!r}")
        if self.interval != "auto" and (
            isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1
        ):
            raise ValueError(
                f"checkpoint.interval must be an integer >= 1 (steps between saves) or auto, "
                f"got {self.interval!r}"
            )
        self._check_auto()
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
        self._check_tiers()
        if not self.pg_timeout_s > 0:
            raise ValueError(f"checkpoint.pg_timeout_s must be > 0 seconds, got {self.pg_timeout_s!r}")

    def _check_tiers(self) -> None:
        if self.tiers not in _TIERS:
            raise ValueError(f"checkpoint.tiers must be one of {', '.join(_TIERS)}, got {self.tiers!r}")
        if self.tiers in ("peer", "local") and self.mode == "async" and self.backend != "kit":
            raise ValueError(
                f"checkpoint.tiers={self.tiers} needs the kit writer, not backend {self.backend} (DCP's own "
                "staging keeps no copy the tier can take): use checkpoint.backend=kit, or tiers=off"
            )
        if self.tiers in ("peer", "local") and self.mode == "off":
            raise ValueError(
                f"checkpoint.tiers={self.tiers} with checkpoint.mode=off: nothing is saved; use tiers=off"
            )
        keep = self.tier_keep
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= TIER_KEEP_MAX:
            raise ValueError(f"checkpoint.tier_keep must be an integer in [1, {TIER_KEEP_MAX}], got {keep!r}")
        rate = self.shared_read_mib_s
        if (
            isinstance(rate, bool)
            or not isinstance(rate, (int, float))
            or not math.isfinite(rate)
            or rate < 0
        ):
            raise ValueError(
                f"checkpoint.shared_read_mib_s must be a finite number of MiB/s >= 0 (0: no cap), "
                f"got {rate!r}"
            )

    @property
    def auto(self) -> bool:
        """The interval is chosen by the run (fsdpkit.resilience.checkpoint.interval)."""
        return self.interval == "auto"

    def _check_auto(self) -> None:
        for name in ("interval_min", "interval_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INTERVAL_CAP:
                raise ValueError(
                    f"checkpoint.{name} must be an integer in [1, {INTERVAL_CAP}] (steps), got {value!r}"
                )
        if self.interval_min > self.interval_max:
            raise ValueError(
                f"checkpoint.interval_min ({self.interval_min}) must be <= checkpoint.interval_max "
                f"({self.interval_max}): raise interval_max or lower interval_min"
            )
        mtbf = self.mtbf_s
        if isinstance(mtbf, bool) or not isinstance(mtbf, (int, float)) or not math.isfinite(mtbf):
            raise ValueError(f"checkpoint.mtbf_s must be a finite number of seconds, got {mtbf!r}")
        if not 0 < mtbf <= _WEEK_S:
            raise ValueError(
                f"checkpoint.mtbf_s must be > 0 and at most {_WEEK_S:.0f} seconds (a week), got {mtbf!r}"
            )
