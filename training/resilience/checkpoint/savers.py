"""The three ways to run one save (config `checkpoint.mode` / `backend`):
  sync        the loop runs the DCP save and the commit itself (the whole save is stall);
  async kit   the loop only takes the state (references + small deep copies); the writer thread copies
              every tensor into reused host buffers, writes with `KitStorageWriter`, then commits;
  async dcp   PyTorch's `dcp.async_save` with async staging into a reused `DefaultStager`, same writer and
              commit record.
Each ends in `SaveFinisher.finish`, a collective every rank reaches on the same path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.finish import SaveFinisher
from fsdpkit.resilience.checkpoint.guard import SaveAbandoned
from fsdpkit.resilience.checkpoint.inflight import InflightSave, OnWait
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.shards import ShardWriter
from fsdpkit.resilience.checkpoint.staging import HostStager, TakenState, flatten_state, take
from fsdpkit.resilience.checkpoint.tier_hook import TierHook
from fsdpkit.resilience.checkpoint.worker import BackgroundWorker
from fsdpkit.resilience.checkpoint.writer import KitStorageWriter
from fsdpkit.runtime import torch_internals as internals

log = logging.getLogger("fsdpkit.resilience.checkpoint")

FOLDER_REFUSED = "rank 0 could not create or clear the step folder (see its log)"


@dataclass(frozen=True)
class SaveParts:
    """What every path shares: the shard writer, the commit, the memory tiers, the checkpoint group."""

    shards: ShardWriter
    finisher: SaveFinisher
    tiers: TierHook
    comm: CheckpointComm


class SavePath:
    """One way to run a save; `start` it on the training thread."""

    background = False
    """Whether `start` may return before the save is over (so the loop must wait on it later)."""
    stager: HostStager | None = None
    """The host copy of the last save (async kit only), for an in-process restart from memory."""

    def __init__(self, parts: SaveParts) -> None:
        self._shards = parts.shards
        self._finisher = parts.finisher
        self._tiers = parts.tiers
        self._comm = parts.comm

    def start(self, save: InflightSave, state: dict[str, Any]) -> bool:
        """Start the save; True if it goes on in the background (wait for `save.done`)."""
        raise NotImplementedError

    def drained(self, timeout_s: float, *, give_up: Callable[[], bool] | None = None) -> bool:
        """Whether every save handed off so far has stopped (nothing is handed off here)."""
        return True

    def release(self) -> None:
        """Drop what still holds an abandoned save's staged state (nothing here)."""

    def close(self, timeout_s: float | None) -> None:
        """Stop the background work and free the staging memory (nothing here)."""


class SyncSave(SavePath):
    """The loop runs the whole save, commit included: all of it is stall, none of it can leak."""

    def start(self, save: InflightSave, state: dict[str, Any]) -> bool:
        save.staged.set()
        ok, error, files = False, None, {}
        if self._shards.prepare_folder(save.step):
            ok, error, files = self._shards.write(save, state)
        else:
            error = FOLDER_REFUSED
        tiered = ok and self._tiers.write(save, flatten_state(state))
        self._finisher.finish(save, ok, error, files, tiered=tiered)
        return False


class BackgroundSavePath(SavePath):
    """A save path whose slow part runs on one writer thread, in order."""

    background = True

    def __init__(self, parts: SaveParts, *, worker: BackgroundWorker, on_wait: OnWait) -> None:
        super().__init__(parts)
        self._worker: BackgroundWorker | None = worker
        self._on_wait = on_wait

    def _submit(self, save: InflightSave, job: Callable[[], None]) -> None:
        self._worker.submit(lambda: self._background(save, job))

    def _background(self, save: InflightSave, job: Callable[[], None]) -> None:
        """Run a save's background part; whatever stops it (abandoned, a collective that failed because
        a peer died or the group was aborted) is reported once, and the save always ends."""
        try:
            job()
        except SAVE_ERRORS as exc:
            if not save.done.is_set():
                self._finisher.report_failed(save.step, one_line(exc))
        finally:
            save.end()

    def drained(self, timeout_s: float, *, give_up: Callable[[], bool] | None = None) -> bool:
        if self._worker is None:
            return True
        with self._on_wait():
            return self._worker.drained(timeout_s, give_up=give_up)

    def close(self, timeout_s: float | None) -> None:
        """`timeout_s` None: wait for the jobs already submitted; else an abandoned writer may outlive it."""
        if self._worker is None:
            return
        if not self._worker.close(timeout_s=timeout_s):
            log.warning(
                "the abandoned checkpoint writer did not stop within %.0f s; it can no longer commit",
                timeout_s,
            )
        self._worker = None


class KitAsyncSave(BackgroundSavePath):
    """The loop takes references; the writer thread copies into reused host buffers, writes, commits."""

    def __init__(self, parts: SaveParts, *, worker: BackgroundWorker, on_wait: OnWait) -> None:
        super().__init__(parts, worker=worker, on_wait=on_wait)
        self.stager = HostStager()

    def start(self, save: InflightSave, state: dict[str, Any]) -> bool:
        taken = take(save.step, state)
        self._submit(save, lambda: self._job(save, taken))
        return True

    def _job(self, save: InflightSave, taken: TakenState) -> None:
        """Stage (into the memory tier's blob where there is one: no second copy), write the shard from
        it, seal the tier's copy or write it (a state on a GPU), then the collective end of the save."""
        staged = None
        try:
            save.guard.point("staging")
            staged = self._tiers.reserve(save, taken)
            tree = self.stager.copy(taken, save.guard, into=None if staged is None else staged.views)
        except SaveAbandoned:
            self._tiers.discard(staged)
            raise
        except SAVE_ERRORS as exc:  # e.g. out of host memory: fail this save, keep training
            self._tiers.discard(staged)
            tree, copy_error, staged = None, one_line(exc), None
        else:
            copy_error = None
        finally:
            save.staged.set()
        ok, error, files = False, copy_error, {}
        try:
            if self._comm.all_true(tree is not None) and self._shards.prepare_folder(save.step):
                ok, error, files = self._shards.write(save, tree)
            elif error is None:
                error = "another rank could not stage or clear the step folder"
        except BaseException:
            self._tiers.discard(staged)
            raise
        tiered = self._tiers.keep(save, taken, staged, tree, ok)
        self._finisher.finish(save, ok, error, files, tiered=tiered)

    def close(self, timeout_s: float | None) -> None:
        super().close(timeout_s)
        self.stager.close()


class DcpAsyncSave(BackgroundSavePath):
    """PyTorch's `dcp.async_save`, staged into a reused `DefaultStager`; the kit's writer and commit."""

    def __init__(self, parts: SaveParts, *, worker: BackgroundWorker, on_wait: OnWait) -> None:
        super().__init__(parts, worker=worker, on_wait=on_wait)
        self._dcp_stager: Any = None

    def start(self, save: InflightSave, state: dict[str, Any]) -> bool:
        if not self._shards.prepare_folder(save.step):
            save.staged.set()
            self._finisher.finish(save, False, FOLDER_REFUSED, {})
            return False
        stager = self._reused_stager()
        writer = self._shards.storage_writer(save)
        try:
            response = dcp.async_save(
                flatten_state(state),
                storage_writer=writer,
                planner=self._shards.planner,
                process_group=self._comm.group,
                async_stager=stager,
                no_dist=not self._comm.distributed,
            )
        except SAVE_ERRORS as exc:
            save.staged.set()
            self._finisher.finish(save, False, one_line(exc), {})
            return False
        # The futures (their results, or an error's traceback) hold the staged state, whose DTensors hold
        # copies of the device mesh and so the training process group: dropped once waited for, or an
        # aborted group would keep its sockets open and a peer would hang in it.
        pending = [response]
        del response
        self._submit(save, lambda: self._job(save, pending, writer))
        return True

    def _reused_stager(self) -> Any:
        """The reused DefaultStager (torch 2.11: one stager per save)."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._dcp_stager is not None and not internals.dcp_stager_reusable():
            self.release()
        if self._dcp_stager is None:
            cuda = torch.cuda.is_available()
            self._dcp_stager = DefaultStager(StagingOptions(cuda, False, True, cuda))
        return self._dcp_stager

    def _job(self, save: InflightSave, pending: list[Any], writer: KitStorageWriter) -> None:
        response = pending.pop()
        try:
            save.guard.point("staging")
            response.staging_completion.result()
        except SAVE_ERRORS as exc:
            error = one_line(exc)
        else:
            error = None
        finally:
            save.staged.set()
        try:
            response.upload_completion.result()
        except SAVE_ERRORS as exc:
            error = error or one_line(exc)
        del response
        t_written = time.time() - save.t_request
        if error is None:
            self._shards.emit_write(save.step, t_written, writer.files)
        self._finisher.finish(save, error is None, error, dict(writer.files))

    def release(self) -> None:
        """DCP's staged DTensors carry copies of the device mesh, and a copied mesh re-registers the
        training group: kept alive, it would keep an aborted group's sockets open."""
        if self._dcp_stager is not None:
            self._dcp_stager.close()
            self._dcp_stager = None

    def close(self, timeout_s: float | None) -> None:
        super().close(timeout_s)
        self.release()


def save_path(cfg: CheckpointConfig, parts: SaveParts, *, rank: int, on_wait: OnWait) -> SavePath:
    """The path `cfg` asks for (mode off: the sync path, which `maybe_save` never reaches)."""
    if cfg.mode != "async":
        return SyncSave(parts)
    worker = BackgroundWorker(f"ckpt-writer-rank{rank}", idle=cfg.writer_priority == "idle")
    kind = KitAsyncSave if cfg.backend == "kit" else DcpAsyncSave
    return kind(parts, worker=worker, on_wait=on_wait)
