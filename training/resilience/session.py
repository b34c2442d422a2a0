"""`Session`: one process group's training state and the checkpointer that saves it (public API).

The script's `build` makes one on every start and after every in-process restart (a new process group
needs new FSDP state and a new checkpointer); `run` restores it (from the failed session's live state,
the host copy of the last save, or the newest verified commit on disk) before `train` sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from fsdpkit.resilience.checkpoint.checkpointer import Checkpointer
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy

if TYPE_CHECKING:
    from fsdpkit.resilience.config import ResilienceConfig
    from fsdpkit.resilience.state import TrainState
    from fsdpkit.runtime.distributed import DistContext
    from fsdpkit.runtime.events import EventLog
    from fsdpkit.runtime.heartbeat import HeartbeatClient


class JobParts(Protocol):
    """What a Session reads of its `Job` (the Job passes itself): the config, the process group, the event
    log, the heartbeat (a checkpoint wait is announced on it) and whether the restart is an in-process one."""

    cfg: ResilienceConfig
    ctx: DistContext | None
    events: EventLog
    heartbeat: HeartbeatClient
    live_restart: bool


STATE_KEY = "train"
"""The checkpoint's top-level key for the TrainState (the kit's checkpoints since the first release)."""


class Session:
    """A TrainState and its asynchronous, verified checkpointer (config section `checkpoint`): saves at
    the steps the checkpointer decides (`interval`, or `auto`), each shard checksummed, committed by rank 0
    after every rank's write; `load` takes the newest commit that verifies and says why it skipped others."""

    def __init__(self, job: JobParts, state: TrainState) -> None:
        if job.ctx is None:
            raise RuntimeError(
                "a Session is built inside run()'s build callback, once the process group exists"
            )
        self.state = state
        state.seed = job.cfg.run.seed
        self.checkpointer = Checkpointer(
            job.cfg.checkpoint,
            run_dir=job.cfg.run.run_dir,
            rank=job.ctx.rank,
            world_size=job.ctx.world_size,
            events=job.events,
            on_wait=job.heartbeat.checkpoint_wait,
            live=job.live_restart,
            reshard=ReshardPolicy(
                global_batch=job.cfg.training.global_batch or None, problem=state.reshard_problem()
            ),
        )

    @property
    def model(self) -> torch.nn.Module:
        return self.state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.state.optimizer

    @property
    def step(self) -> int:
        """The last finished step (0 before the first)."""
        return self.state.step

    @property
    def ckpt_state(self) -> dict[str, TrainState]:
        return {STATE_KEY: self.state}
