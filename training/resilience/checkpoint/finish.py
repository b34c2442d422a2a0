"""The end of every save, whichever path ran it: rank 0 commits what all ranks wrote, or says why not.

A step exists for resume only with its commit record, written last; a failed save is logged and counted
(`failed` event) and training goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from fsdpkit.resilience.checkpoint.commit import (
    CommitRecord,
    CommitRefused,
    FileEntry,
    merge_rank_files,
    write_commit,
)
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.guard import SaveAbandoned
from fsdpkit.resilience.checkpoint.inflight import InflightSave
from fsdpkit.resilience.checkpoint.layout import fsync_dir, step_dir
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.retention import prune
from fsdpkit.resilience.checkpoint.tier_hook import TierHook
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("fsdpkit.resilience.checkpoint")


class SaveFinisher:
    """Gathers every rank's outcome of a save, commits it on rank 0 and prunes; then the memory tiers."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        root: Path,
        rank: int,
        world_size: int,
        comm: CheckpointComm,
        events: EventLog,
        reshard: ReshardPolicy,
        tiers: TierHook,
        abandoned: threading.Event,
    ) -> None:
        self.cfg = cfg
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.events = events
        self.reshard = reshard
        self._comm = comm
        self._tiers = tiers
        self._abandoned = abandoned

    def finish(
        self,
        save: InflightSave,
        ok: bool,
        error: str | None,
        files: dict[str, FileEntry],
        *,
        tiered: bool = False,
    ) -> None:
        """Collective: gather every rank's outcome; rank 0 commits (or reports), then prunes. With memory
        tiers the ranks first agree whether every rank wrote its copy (`tiered`), and after the commit send
        the copies to their buddies."""
        try:
            everyone = self._tiers.agree(tiered)
            gathered = self._comm.gather_to_zero((ok, error, files))
            reached = True
        except SAVE_ERRORS as exc:  # a peer died mid-save: the step stays uncommitted
            gathered, reached, everyone = None, False, False
            ok, error = False, error or one_line(exc)
        if not ok:
            self.report_failed(save.step, error or "unknown error")
        if self.rank == 0 and gathered is not None:
            self._commit(save, gathered)
        self._tiers.after_commit(save, everyone and reached)
        save.ok = ok
        save.end()

    def _commit(self, save: InflightSave, gathered: list[Any]) -> bool:
        """Rank 0: write the commit record (True), or report why not (False)."""
        errors = [f"rank {r}: {e}" for r, (ok, e, _) in enumerate(gathered) if not ok]
        if errors:
            if gathered[0][0]:  # rank 0 itself wrote fine: report the others' errors once
                self.report_failed(save.step, "; ".join(errors))
            return False
        folder = step_dir(self.root, save.step)
        try:
            save.guard.point("committing")
            files = merge_rank_files([per_rank for _, _, per_rank in gathered], self.world_size)
        except (SaveAbandoned, CommitRefused) as exc:
            self.report_failed(save.step, f"not committed: {one_line(exc)}")
            return False
        record = CommitRecord(
            step=save.step, world_size=self.world_size, files=files,
            global_batch=self.reshard.global_batch, reshard=self.reshard.record_reshard,
        )  # fmt: skip
        try:
            fsync_dir(folder)
            write_commit(folder, record)
        except OSError as exc:
            self.report_failed(save.step, f"commit record: {one_line(exc)}")
            return False
        self.events.emit(
            "ckpt",
            step=save.step,
            phase="commit",
            duration_s=time.time() - save.t_request,
            bytes=record.total_bytes,
        )
        try:
            prune(self.root, keep=self.cfg.keep, in_flight=save.step)
        except OSError as exc:
            log.warning("checkpoint retention could not delete old steps: %s", one_line(exc))
        return True

    def report_failed(self, step: int, error: str) -> None:
        """The `failed` event and one line; after `abandon()` the restart is named as the cause."""
        if self._abandoned.is_set():  # whatever surfaced (often the aborted group's error), this is why
            log.warning("checkpoint of step %d abandoned by an in-process restart: %s", step, error)
            error = f"abandoned by an in-process restart: {error}"
        else:
            log.error("checkpoint of step %d failed, training goes on: %s", step, error)
        self.events.emit("ckpt", step=step, phase="failed", duration_s=0.0, error=error)
