"""`plan_batch`: how many micro-batches each rank runs per optimizer step so the global batch stays exact.

The global batch (samples per optimizer step over all ranks) is what the optimizer and the LR schedule see;
the world size is not. When a run goes on with another number of ranks (a restart on fewer nodes, an
elastic shrink or grow), gradient accumulation takes up the difference: accum = global / (world x micro).
A world size that cannot keep the global batch exactly is refused before any process group, in one line
that lists the world sizes that can: the run never silently trains with another batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Generic, TypeVar

from fsdpkit.contracts.global_batch import default_global_batch, refusal
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir
from fsdpkit.resilience.config import ConfigError, ResilienceConfig

Config = TypeVar("Config", bound=ResilienceConfig)


@dataclass(frozen=True)
class BatchPlan(Generic[Config]):
    """The global batch of a job, how its ranks split it, and the config that records it."""

    global_batch: int
    """Samples per optimizer step, over all ranks."""
    micro_batch: int
    """Samples per rank per forward and backward."""
    world_size: int
    accum: int
    """Micro-batches per rank per optimizer step."""
    source: str
    """Where the global batch came from: training.global_batch, the checkpoint, or the config's product."""
    config: Config
    """The config with the plan in it (training.global_batch, training.grad_accum_steps): pass this one to
    `run`, so each checkpoint declares its global batch, which lets it resume on another world size."""

    def line(self) -> str:
        return (
            f"global batch {self.global_batch} samples per optimizer step ({self.source}): "
            f"{self.world_size} rank(s) x {self.accum} micro-batch(es) x {self.micro_batch} samples"
        )


def plan_batch(cfg: Config, *, micro_batch: int, world_size: int) -> BatchPlan[Config]:
    """The job's BatchPlan, before any process group; ConfigError (one line) when `world_size` cannot keep
    the global batch exactly. The global batch is training.global_batch when set; else the one the newest
    checkpoint declares (a run keeps its global batch through every restart, on any world size: to change
    it, set training.global_batch); else micro_batch x training.grad_accum_steps x world_size. `cfg` is
    frozen and left as it is: the plan's `config` is a new one with the plan recorded."""
    from fsdpkit.resilience.checkpoint.resume import newest_record  # torch: only when planning

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
    training = dataclasses.replace(cfg.training, global_batch=global_batch, grad_accum_steps=accum)
    return BatchPlan(
        global_batch, micro_batch, world_size, accum, source, dataclasses.replace(cfg, training=training)
    )
