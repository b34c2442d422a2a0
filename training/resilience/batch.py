"""`plan_batch`: how many micro-batches each rank runs per optimizer step so the global batch stays exact.

The global batch (samples per optimizer step over all ranks) is what the optimizer and the LR schedule see;
the world size is not. When a run goes on with another number of ranks (a restart on fewer nodes, an
elastic shrink or grow), gradient accumulation takes up the difference: accum = global / (world x micro).
A world size that cannot keep the global batch exactly is refused before any process group, in one line
that lists the world sizes that can: the run never silently trains with another batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from training.resilience.checkpoint.layout import checkpoints_dir
from training.resilience.config import ConfigError

if TYPE_CHECKING:
    from training.resilience.config import ResilienceConfig

MAX_LISTED = 12
"""World sizes named in a refusal, at most."""


@dataclass(frozen=True)
class BatchPlan:
    """The global batch of a job and how its ranks split it."""

    global_batch: int
    """Samples per optimizer step, over all ranks."""
    micro_batch: int
    """Samples per rank per forward and backward."""
    world_size: int
    accum: int
    """Micro-batches per rank per optimizer step."""
    source: str
    """Where the global batch came from: training.global_batch, the checkpoint, or the config's product."""

    def line(self) -> str:
        return (
            f"global batch {self.global_batch} samples per optimizer step ({self.source}): "
            f"{self.world_size} rank(s) x {self.accum} micro-batch(es) x {self.micro_batch} samples"
        )


def world_sizes_keeping(global_batch: int, micro_batch: int) -> list[int]:
    """Every world size that splits `global_batch` exactly into micro-batches of `micro_batch`."""
    if global_batch % micro_batch:
        return []
    per = global_batch // micro_batch
    small = [w for w in range(1, int(per**0.5) + 1) if per % w == 0]
    return sorted(set(small) | {per // w for w in small})


def default_global_batch(micro_batch: int, accum: int, world_size: int) -> int:
    """The global batch a job declares without training.global_batch (and without a checkpoint that declares
    one): what its ranks compute per optimizer step."""
    return micro_batch * accum * world_size


def refusal(global_batch: int, micro_batch: int, world_size: int, source: str, *, kept: bool = False) -> str:
    """The one line that refuses a world size which cannot keep `global_batch` exactly; `kept`: the batch is
    a checkpoint's (another batch would not resume it: the fixes are the sizes, or a new run)."""
    sizes = world_sizes_keeping(global_batch, micro_batch)
    multiple = micro_batch * world_size
    fix = "use a new run.id" if kept else f"set training.global_batch to a multiple of {multiple}"
    if not sizes:
        return (
            f"the global batch {global_batch} ({source}) is not a multiple of the micro-batch {micro_batch}: "
            f"{fix}"
        )
    listed = ", ".join(map(str, sizes[:MAX_LISTED])) + (", ..." if len(sizes) > MAX_LISTED else "")
    return (
        f"the global batch {global_batch} ({source}) cannot be split exactly over {world_size} rank(s) of "
        f"{micro_batch} samples: run on {listed} rank(s), or {fix}"
    )


def plan_batch(cfg: ResilienceConfig, *, micro_batch: int, world_size: int) -> BatchPlan:
    """The job's BatchPlan, before any process group; ConfigError (one line) when `world_size` cannot keep
    the global batch exactly. The global batch is training.global_batch when set; else the one the newest
    checkpoint declares (a run keeps its global batch through every restart, on any world size: to change
    it, set training.global_batch); else micro_batch x training.grad_accum_steps x world_size. The plan is
    recorded in `cfg` (training.global_batch, training.grad_accum_steps): each checkpoint then declares its
    global batch, which is what lets it resume on another world size."""
    from training.resilience.checkpoint.resume import newest_record  # torch: only when planning

    if micro_batch <= 0 or world_size <= 0:
        raise ConfigError(f"micro-batch {micro_batch} and world size {world_size} must be > 0")
    own = default_global_batch(micro_batch, cfg.training.grad_accum_steps, world_size)
    global_batch, source, kept = cfg.training.global_batch, "training.global_batch", False
    if not global_batch:
        record = newest_record(checkpoints_dir(cfg.run.run_dir)) if cfg.checkpoint.mode != "off" else None
        if record is not None and record.global_batch:
            global_batch, kept = record.global_batch, True
            source = f"kept from the checkpoint of step {record.step}"
            if own != global_batch:  # shown, never silent: the config alone would give another batch
                source += f"; data.batch_size x grad_accum_steps x world size would be {own}"
        else:
            global_batch, source = own, "data.batch_size x training.grad_accum_steps x world size"
    if global_batch % (micro_batch * world_size):
        raise ConfigError(refusal(global_batch, micro_batch, world_size, source, kept=kept))
    accum = global_batch // (micro_batch * world_size)
    cfg.training.global_batch, cfg.training.grad_accum_steps = global_batch, accum
    return BatchPlan(global_batch, micro_batch, world_size, accum, source)
