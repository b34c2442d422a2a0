"""Whether a checkpoint written by one world size may load into another (a resharded resume).

DCP reshards the model and optimizer (DTensors on a 1-D mesh) by itself. What makes a resharded resume
trustworthy is the rest of the state: the data position must be global (the kit's sample cursor) and the
global batch (samples per optimizer step) the one the run was trained with, so the new world consumes the
same sequence of global batches, every sample once. Per-rank state (a user extra such as an EMA kept per
rank, a loader whose position differs between ranks) cannot be split onto another number of ranks: a
checkpoint that holds any says so in its commit record (`CommitRecord.reshard`) and is refused elsewhere.
The RNG is per rank; on a resharded resume each rank is seeded again from (run seed, step, rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fsdpkit.contracts.seeds import mix
from fsdpkit.resilience.checkpoint.commit import CommitRecord


@dataclass(frozen=True)
class ReshardPolicy:
    """What this job's state allows when the checkpoint it resumes was written by another world size."""

    global_batch: int | None = None
    """Samples per optimizer step this job trains with (`training.global_batch`); None: not declared."""
    problem: str | None = None
    """Why this job's state cannot be resharded (per-rank state), or None."""

    @property
    def record_reshard(self) -> str:
        """What a commit record of this state says about resharding ('' = it may be resharded)."""
        return self.problem or ""


def refusal(record: CommitRecord, folder: Path, world_size: int, policy: ReshardPolicy) -> str | None:
    """None when `record` (from `folder`) may load into `world_size` ranks under `policy`, else one line
    that names both sizes, why, and what to do."""
    if record.world_size == world_size:
        return None
    head = f"checkpoint {folder} was written by {record.world_size} rank(s), this job has {world_size}"
    fix = f"resume it on {record.world_size} rank(s), or use a new run.id to start from step 0"
    if record.reshard is None:
        return f"{head} and it predates resharded resume (its record has no global batch): {fix}"
    if record.reshard:
        return f"{head} and it cannot be resharded ({record.reshard}): {fix}"
    if policy.problem:
        return f"{head} and this job's state cannot be resharded ({policy.problem}): {fix}"
    if record.global_batch is None:
        return f"{head} and its run declared no global batch (training.global_batch): {fix}"
    if policy.global_batch != record.global_batch:
        mine = "none declared" if policy.global_batch is None else f"{policy.global_batch}"
        return (
            f"{head}; it was trained with a global batch of {record.global_batch} samples per optimizer "
            f"step, this job's is {mine}: set training.global_batch={record.global_batch} to keep it, or "
            f"{fix}"
        )
    return None


def reseed(seed: int, step: int, rank: int) -> int:
    """The seed of `rank`'s generators after a resharded resume at `step`: a pure function of the three,
    so the same restart draws the same numbers (the kit's model draws none: no dropout)."""
    return mix(seed, step, rank)
