"""Every rank's part of a save on shared storage: the step folder made ready, then its shard written.

The DCP plans are cached under this writer's planner only (ScopedSavePlanner), so nothing planned for
one process group is reused by the next; `renew_planner` drops them once a group is abandoned.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from fsdpkit.resilience.checkpoint.commit import FileEntry
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.inflight import InflightSave
from fsdpkit.resilience.checkpoint.layout import remove_step, step_dir
from fsdpkit.resilience.checkpoint.planner import ScopedSavePlanner
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.writer import KitStorageWriter
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("fsdpkit.resilience.checkpoint")

Written = tuple[bool, str | None, dict[str, FileEntry]]
"""(ok, error, files written) of one rank's shard."""


class ShardWriter:
    """Writes this rank's shard of a step with DCP on the checkpoint group."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        root: Path,
        rank: int,
        world_size: int,
        comm: CheckpointComm,
        events: EventLog,
    ) -> None:
        self.cfg = cfg
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.events = events
        self.planner = ScopedSavePlanner()
        self._comm = comm

    def renew_planner(self) -> None:
        """Drop the plans cached so far and plan afresh (the old planner also held the last state dict)."""
        self.planner.forget()
        self.planner = ScopedSavePlanner()

    def prepare_folder(self, step: int) -> bool:
        """Rank 0 clears a leftover folder of this step (commit record first); all ranks agree it worked."""
        ok = True
        if self.rank == 0:
            folder = step_dir(self.root, step)
            try:
                if folder.exists():
                    remove_step(self.root, step)
                folder.mkdir(parents=True)
            except OSError as exc:
                ok = False
                log.error("cannot prepare checkpoint folder %s: %s", folder, one_line(exc))
        return self._comm.all_true(ok)

    def write(self, save: InflightSave, tree: dict[str, Any]) -> Written:
        """Every rank writes its shard (a DCP save on the checkpoint group)."""
        writer = self.storage_writer(save)
        try:
            dcp.save(
                tree,
                storage_writer=writer,
                planner=self.planner,
                process_group=self._comm.group,
                no_dist=not self._comm.distributed,
            )
        except SAVE_ERRORS as exc:
            return False, one_line(exc), {}
        self.emit_write(save.step, time.time() - save.t_request, writer.files)
        return True, None, dict(writer.files)

    def storage_writer(self, save: InflightSave) -> KitStorageWriter:
        """This save's writer: refuses to write as another rank or world size, stops when abandoned."""
        return KitStorageWriter(
            step_dir(self.root, save.step),
            direct_io=self.cfg.direct_io,
            rank=self.rank,
            world_size=self.world_size,
            guard=save.guard,
        )

    def emit_write(self, step: int, duration_s: float, files: dict[str, FileEntry]) -> None:
        """The `write` event: this rank's shard is durable."""
        nbytes = sum(f.size for f in files.values())
        self.events.emit("ckpt", step=step, phase="write", duration_s=duration_s, bytes=nbytes)
