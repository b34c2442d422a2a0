"""The checkpointer the training loop calls: `maybe_save`, `load`, `wait`, `close` (+ in-memory restore).

One save at a time, in one of three ways (config `checkpoint.mode` / `backend`):
  sync        the loop runs the DCP save and the commit itself (the whole save is stall);
  async kit   the loop only takes the state (references + small deep copies); the writer thread copies
              every tensor into reused host buffers, writes with `KitStorageWriter`, then commits;
  async dcp   PyTorch's `dcp.async_save` with async staging into a reused `DefaultStager`, same writer and
              commit record.
While a host copy is running, every `torch.optim` optimizer step in the process waits for it (a global
optimizer step pre-hook), so no later update can reach the checkpoint; forward and backward overlap it.

When the next save comes due while the previous one is still being written, `maybe_save` WAITS for it
and times the wait as stall. Why: `checkpoint.interval` is the user's bound on lost work; skipping would
silently double it exactly when storage is slow. The wait is visible (stall events, a warning that names
the fix: a longer interval or faster storage). Skipping would also need a collective to agree, since
ranks may disagree on whether their own write finished (reference: torch-on-cpu.md §2.5).

When: every `interval` steps, or with `interval: auto` the interval rank 0 chooses from its measurements
(training.resilience.checkpoint.interval: Young/Daly), which train_step's loss all-reduce hands to every rank
(`interval_proposal` / `agree_interval`), so all ranks save at the same steps.

Events (`ckpt`, see training.runtime.events): stall (loop blocked: in maybe_save, and in the optimizer
pre-hook if the copy was not done), write (this rank's shard durable; duration from the save request), commit
(rank 0, record durable; duration from the request), failed (error; rank 0 for the step, plus each rank
whose own write failed: count distinct steps), drain (`wait()`), skipped (a second save of one step).
A failed save is logged and counted; training goes on.

Every wait of the training thread on a checkpoint (the host copy inside or before an optimizer step, the
previous save, a test hold, the drain) runs inside `on_wait()` (the trainer passes its heartbeat's
"checkpoint" phase), so a slow save never looks like a hang.

In-process restart: `abandon()` (once the process groups are aborted) stops the in-flight save at its
next phase boundary (training.resilience.checkpoint.guard): it never writes or commits without its group, and
it is
reported as failed ("abandoned"). Its DCP plans are cached under this checkpointer only (ScopedSavePlanner)
and dropped at `close()`, so nothing planned for one group is reused by the next.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.optim.optimizer import register_optimizer_step_pre_hook

from training.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from training.resilience.checkpoint.commit import (
    CommitRecord,
    CommitRefused,
    FileEntry,
    merge_rank_files,
    write_commit,
)
from training.resilience.checkpoint.config import CheckpointConfig
from training.resilience.checkpoint.guard import SaveAbandoned, SaveGuard, SaveHolds
from training.resilience.checkpoint.interval import AutoInterval
from training.resilience.checkpoint.layout import (
    checkpoints_dir,
    fsync_dir,
    is_committed,
    list_steps,
    remove_step,
    step_dir,
)
from training.resilience.checkpoint.memory_tiers import MemoryTiers, TierRestore
from training.resilience.checkpoint.planner import ScopedSavePlanner
from training.resilience.checkpoint.reshard import ReshardPolicy
from training.resilience.checkpoint.resume import CheckpointError, one_line, resume
from training.resilience.checkpoint.retention import prune
from training.resilience.checkpoint.shared_reads import SHARED_READS
from training.resilience.checkpoint.staging import HostStager, flatten_state, restore_into, take
from training.resilience.checkpoint.worker import BackgroundWorker
from training.resilience.checkpoint.writer import KitStorageWriter
from training.runtime import torch_internals as internals
from training.runtime.events import EventLog

log = logging.getLogger("training.resilience.checkpoint")

__all__ = ["CheckpointError", "Checkpointer"]


@dataclass
class _Save:
    """One save from request to commit."""

    step: int
    t_request: float
    guard: SaveGuard
    staged: threading.Event = field(default_factory=threading.Event)
    """Set once the host copy is complete (immediately in sync mode)."""
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False

    def end(self) -> None:
        """The save is over (committed or failed): nothing waits on it any more."""
        self.staged.set()
        self.done.set()
        self.guard.held.set()  # a save that never reached its test hold will not reach it now


UNDECLARED = "saved by a Checkpointer without a ReshardPolicy: nothing said its state may be resharded"
"""What the record of a state nobody described says (Session always describes its TrainState)."""


class Checkpointer:
    """Saves and restores a dict of Stateful objects / tensors (as `dcp.save` takes) under the run folder."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        run_dir: str | os.PathLike[str],
        rank: int,
        world_size: int,
        events: EventLog | None = None,
        on_wait: Callable[[], AbstractContextManager[object]] | None = None,
        live: bool = False,
        reshard: ReshardPolicy | None = None,
    ) -> None:
        """`live`: this session resumes from the live state of the last one (an in-process restart that
        rolls nothing back: not a fault for `interval: auto`). `reshard`: whether the saved state may load
        into another world size, and its global batch (in each commit record; checked at resume)."""
        if cfg.mode == "async" and cfg.backend == "nvrx":
            raise ValueError(
                "checkpoint.backend nvrx is not wired into the Checkpointer yet (NVRx is measured in "
                "bench/gpu/checkpoint_gpu.py only): use --checkpoint.backend kit or dcp"
            )
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.reshard = reshard or ReshardPolicy(problem=UNDECLARED)
        self.root = checkpoints_dir(run_dir)
        self.events = events or EventLog(None, role="trainer", rank=rank)
        self._comm = CheckpointComm(rank=rank, world_size=world_size, timeout_s=cfg.pg_timeout_s)
        self._planner = ScopedSavePlanner()
        self._on_wait = on_wait or contextlib.nullcontext
        self._abandoned = threading.Event()
        self._holds = SaveHolds(run_dir, rank)
        self._inflight: _Save | None = None
        self._last_step: int | None = None
        """The step last saved or restored: a second save of it is skipped; `auto` counts from it."""
        self._busy_waits = 0
        self._auto = (
            AutoInterval(cfg, run_dir=run_dir, rank=rank, events=self.events, live=live)
            if cfg.auto and cfg.mode != "off"
            else None
        )
        self._async = cfg.mode == "async"
        self._stager = HostStager() if self._async and cfg.backend == "kit" else None
        self._dcp_stager: Any = None
        self._worker = (
            BackgroundWorker(f"ckpt-writer-rank{rank}", idle=cfg.writer_priority == "idle")
            if self._async
            else None
        )
        self._hook = register_optimizer_step_pre_hook(self._before_optimizer_step) if self._async else None
        self._tiers = (
            MemoryTiers.from_config(cfg, rank=rank, world_size=world_size, events=self.events)
            if cfg.mode != "off"
            else None
        )
        if cfg.mode != "off" and not self._comm.all_true(self._tiers is not None) and self._tiers is not None:
            log.warning("checkpoint memory tiers off: another node has none (see its log)")
            self._tiers = None  # every rank takes part in the tiers' collectives, or none does
        self.last_source: str | None = None
        """Where the last `load` found its state: memory, peer, shared, or none."""
        SHARED_READS.cap(cfg.shared_read_mib_s)
        if cfg.mode != "off" and rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------------------- saving
    def due(self, step: int) -> bool:
        """Whether `maybe_save(step, ...)` will save, so callers can announce it: every `interval` steps
        (step % interval == 0), or with `auto` once the agreed interval has passed since the last save or
        restore (the same on every rank: see training.resilience.checkpoint.interval)."""
        if self.cfg.mode == "off":
            return False
        if self._auto is None:
            return step % self.cfg.interval == 0
        if self._last_step is None:  # a fresh start, or restored by another (the previous) checkpointer
            self._last_step = step - 1
        return step - self._last_step >= self._auto.current(self.world_size)

    def interval_proposal(self) -> float | None:
        """With `auto`: this rank's share of the interval that train_step's loss all-reduce (SUM) carries
        (rank 0's choice, 0 elsewhere); None with a fixed interval (nothing to carry)."""
        return self._auto.proposal() if self._auto is not None else None

    def agree_interval(self, value: float) -> None:
        """The all-reduced interval (rank 0's choice), the same on every rank: `due` uses it from now on."""
        if self._auto is not None:
            self._auto.agree(value)

    def maybe_save(self, step: int, state: dict[str, Any], *, force: bool = False) -> bool:
        """Save `state` as step `step` if it is due or forced; True if started. With `auto`, rank 0 also
        measures here: the step before this call, and this call's stall (forced final saves excepted)."""
        entered, busy = time.perf_counter(), self._writing()
        started = self._save_if_due(step, state, force=force)
        if self._auto is not None and not force:
            left, writing = time.perf_counter(), self._writing()
            self._auto.observe(step, entered=entered, left=left, saved=started, busy=busy, writing=writing)
        return started

    def _writing(self) -> bool:
        """A save's background part is still running."""
        return self._inflight is not None and not self._inflight.done.is_set()

    def _save_if_due(self, step: int, state: dict[str, Any], *, force: bool) -> bool:
        if self.cfg.mode == "off" or not (force or self.due(step)):
            return False
        if step == self._last_step:
            self.events.emit("ckpt", step=step, phase="skipped", duration_s=0.0, reason="step already saved")
            return False
        t0 = time.time()
        t0p = time.perf_counter()
        self._wait_previous(step)
        hold = self._holds.claim(step) if self._async else None
        save = _Save(step=step, t_request=t0, guard=SaveGuard(step, self._abandoned, hold=hold))
        self._last_step = step
        if not self._async:
            save.staged.set()
            self._run_sync(save, state)
        elif self.cfg.backend == "kit":
            taken = take(step, state)
            self._inflight = save
            self._worker.submit(lambda: self._background(save, lambda: self._kit_job(save, taken)))
        else:
            self._start_dcp_async(save, state)
        if hold is not None:
            with self._on_wait():
                save.guard.held.wait()
        self.events.emit("ckpt", step=step, phase="stall", duration_s=time.perf_counter() - t0p, ts=t0)
        return True

    def _wait_previous(self, step: int) -> None:
        prev = self._inflight
        if prev is None or prev.done.is_set():
            return
        t0 = time.perf_counter()
        with self._on_wait():
            prev.done.wait()
        self._busy_waits += 1
        if self._busy_waits == 1:
            log.warning(
                "checkpoint of step %d was still being written when step %d came due; waited %.2fs, "
                "counted as stall (raise checkpoint.interval or use faster storage)",
                prev.step,
                step,
                time.perf_counter() - t0,
            )

    def _run_sync(self, save: _Save, state: dict[str, Any]) -> None:
        ok, error, files = False, None, {}
        if self._prepare_folder(save.step):
            ok, error, files = self._write(save, state)
        else:
            error = "rank 0 could not create or clear the step folder (see its log)"
        self._finish(save, ok, error, files, tiered=ok and self._tier_write(save, flatten_state(state)))

    def _background(self, save: _Save, job: Callable[[], None]) -> None:
        """Run a save's background part; whatever stops it (abandoned, a collective that failed because
        a peer died or the group was aborted) is reported once, and the save always ends."""
        try:
            job()
        except SAVE_ERRORS as exc:
            if not save.done.is_set():
                self._report_failed(save.step, one_line(exc))
        finally:
            save.end()

    def _kit_job(self, save: _Save, taken: Any) -> None:
        try:
            save.guard.point("staging")
            tree = self._stager.copy(taken, save.guard)
        except SaveAbandoned:
            raise
        except SAVE_ERRORS as exc:  # e.g. out of host memory: fail this save, keep training
            tree, copy_error = None, one_line(exc)
        else:
            copy_error = None
        finally:
            save.staged.set()
        ok, error, files = False, copy_error, {}
        if self._comm.all_true(tree is not None) and self._prepare_folder(save.step):
            ok, error, files = self._write(save, tree)
        elif error is None:
            error = "another rank could not stage or clear the step folder"
        self._finish(save, ok, error, files, tiered=ok and self._tier_write(save, tree))

    def _start_dcp_async(self, save: _Save, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if not self._prepare_folder(save.step):
            save.staged.set()
            self._finish(save, False, "rank 0 could not create or clear the step folder (see its log)", {})
            return
        if self._dcp_stager is not None and not internals.dcp_stager_reusable():
            self._dcp_stager.close()  # torch 2.11: one stager per save
            self._dcp_stager = None
        if self._dcp_stager is None:
            cuda = torch.cuda.is_available()
            self._dcp_stager = DefaultStager(StagingOptions(cuda, False, True, cuda))
        writer = self._storage_writer(save)
        try:
            response = dcp.async_save(
                flatten_state(state),
                storage_writer=writer,
                planner=self._planner,
                process_group=self._comm.group,
                async_stager=self._dcp_stager,
                no_dist=not self._comm.distributed,
            )
        except SAVE_ERRORS as exc:
            save.staged.set()
            self._finish(save, False, one_line(exc), {})
            return
        self._inflight = save
        # The futures (their results, or an error's traceback) hold the staged state, whose DTensors hold
        # copies of the device mesh and so the training process group: dropped once waited for, or an
        # aborted group would keep its sockets open and a peer would hang in it.
        pending = [response]
        del response

        def job() -> None:
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
                self._emit_write(save.step, t_written, writer.files)
            self._finish(save, error is None, error, dict(writer.files), written=True)

        self._worker.submit(lambda: self._background(save, job))

    def _prepare_folder(self, step: int) -> bool:
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

    def _write(self, save: _Save, tree: dict[str, Any]) -> tuple[bool, str | None, dict[str, FileEntry]]:
        """Every rank writes its shard (a DCP save on the checkpoint group); (ok, error, files written)."""
        writer = self._storage_writer(save)
        try:
            dcp.save(
                tree,
                storage_writer=writer,
                planner=self._planner,
                process_group=self._comm.group,
                no_dist=not self._comm.distributed,
            )
        except SAVE_ERRORS as exc:
            return False, one_line(exc), {}
        self._emit_write(save.step, time.time() - save.t_request, writer.files)
        return True, None, dict(writer.files)

    def _storage_writer(self, save: _Save) -> KitStorageWriter:
        """This save's writer: refuses to write as another rank or world size, stops when abandoned."""
        return KitStorageWriter(
            step_dir(self.root, save.step),
            direct_io=self.cfg.direct_io,
            rank=self.rank,
            world_size=self.world_size,
            guard=save.guard,
        )

    def _emit_write(self, step: int, duration_s: float, files: dict[str, FileEntry]) -> None:
        nbytes = sum(f.size for f in files.values())
        self.events.emit("ckpt", step=step, phase="write", duration_s=duration_s, bytes=nbytes)

    def _finish(
        self,
        save: _Save,
        ok: bool,
        error: str | None,
        files: dict[str, FileEntry],
        *,
        written: bool = False,
        tiered: bool = False,
    ) -> None:
        """Collective: gather every rank's outcome; rank 0 commits (or reports), then prunes. With memory
        tiers the ranks first agree whether every rank wrote its copy (`tiered`), and after the commit send
        the copies to their buddies."""
        try:
            everyone = self._tiers is not None and self._comm.all_true(tiered)
            gathered = self._comm.gather_to_zero((ok, error, files))
            reached = True
        except SAVE_ERRORS as exc:  # a peer died mid-save: the step stays uncommitted
            gathered, reached, everyone = None, False, False
            ok, error = False, error or one_line(exc)
        if not ok:
            self._report_failed(save.step, error or "unknown error")
        if self.rank == 0 and gathered is not None:
            self._commit(save, gathered)
        if self._tiers is not None:
            self._finish_tiers(save, everyone and reached)
        save.ok = ok
        save.end()

    def _tier_write(self, save: _Save, tree: dict[str, Any]) -> bool:
        """This rank's memory-tier copy of the step, written after its shard. It counts only once the step
        is committed on shared storage (a restore checks), so it needs no word from rank 0."""
        return self._tiers is not None and self._tiers.write(save.step, tree, save.guard)

    def _finish_tiers(self, save: _Save, everyone: bool) -> None:
        """Every rank's copy of the step is written (`everyone`): each goes to its buddy (collectives on the
        checkpoint group: a peer that dies fails them at once); else this rank's is dropped (a step that
        some rank lacks is never restored from memory). The shared tier's save is over either way."""
        try:
            if everyone:
                self._tiers.replicate(self._comm, save.step, save.guard)
            else:
                self._tiers.forget(save.step)
        except SaveAbandoned as exc:
            log.warning("checkpoint memory tier of step %d abandoned: %s", save.step, exc)
            self._tiers.forget(save.step)
        except SAVE_ERRORS as exc:  # a peer died: its copy of this step may be missing, the commit stands
            log.warning("checkpoint memory tier of step %d: %s", save.step, one_line(exc))

    def _commit(self, save: _Save, gathered: list[Any]) -> bool:
        """Rank 0: write the commit record (True), or report why not (False)."""
        errors = [f"rank {r}: {e}" for r, (ok, e, _) in enumerate(gathered) if not ok]
        if errors:
            if gathered[0][0]:  # rank 0 itself wrote fine: report the others' errors once
                self._report_failed(save.step, "; ".join(errors))
            return False
        folder = step_dir(self.root, save.step)
        try:
            save.guard.point("committing")
            files = merge_rank_files([per_rank for _, _, per_rank in gathered], self.world_size)
        except (SaveAbandoned, CommitRefused) as exc:
            self._report_failed(save.step, f"not committed: {one_line(exc)}")
            return False
        record = CommitRecord(
            step=save.step, world_size=self.world_size, files=files,
            global_batch=self.reshard.global_batch, reshard=self.reshard.record_reshard,
        )  # fmt: skip
        try:
            fsync_dir(folder)
            write_commit(folder, record)
        except OSError as exc:
            self._report_failed(save.step, f"commit record: {one_line(exc)}")
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

    def _report_failed(self, step: int, error: str) -> None:
        if self._abandoned.is_set():  # whatever surfaced (often the aborted group's error), this is why
            log.warning("checkpoint of step %d abandoned by an in-process restart: %s", step, error)
            error = f"abandoned by an in-process restart: {error}"
        else:
            log.error("checkpoint of step %d failed, training goes on: %s", step, error)
        self.events.emit("ckpt", step=step, phase="failed", duration_s=0.0, error=error)

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global optimizer pre-hook: an update must not start while the host copy still reads the state."""
        save = self._inflight
        if save is None or save.staged.is_set():
            return
        t0 = time.time()
        t0p = time.perf_counter()
        with self._on_wait():
            save.staged.wait()
        self.events.emit(
            "ckpt",
            step=save.step,
            phase="stall",
            duration_s=time.perf_counter() - t0p,
            ts=t0,
            waited="staging",
        )

    def maybe_wait_for_staging(self) -> None:
        """Block until the host copy of the in-flight save is done; call before mutating state in place
        outside `torch.optim` (optimizer steps already wait by themselves)."""
        self._before_optimizer_step(None, None, None)

    # ---------------------------------------------------------------------------------------- waiting
    def wait(self) -> None:
        """Drain: block until the in-flight save is committed or failed (a `drain` event times it)."""
        save = self._inflight
        if save is None or save.done.is_set():
            return
        t0 = time.time()
        t0p = time.perf_counter()
        with self._on_wait():
            save.done.wait()
        self.events.emit("ckpt", step=save.step, phase="drain", duration_s=time.perf_counter() - t0p, ts=t0)

    def abandon(self) -> None:
        """In-process restart, right after the process groups were aborted: the in-flight save stops at its
        next phase boundary, never commits, and is reported as failed; every later collective here raises."""
        self._abandoned.set()
        self._comm.abandon()

    def settle(self, timeout_s: float, *, give_up: Callable[[], bool] | None = None) -> bool:
        """After `abandon()` and the abort of the groups: wait (at most timeout_s, or until `give_up()`
        says so) until the abandoned save has stopped, so the caller can free what it held (its staged
        DTensors keep the aborted group's sockets open until collected). True if it stopped.

        Why `give_up`: a save inside a collective on the aborted group whose peer then died never returns
        (measured: a node lost in the middle of the buddy exchange left the survivor's writer in its
        all-to-all), so the caller lets the launcher's SIGTERM end the wait."""
        stopped = True
        if self._worker is not None:
            with self._on_wait():
                stopped = self._worker.drained(timeout_s, give_up=give_up)
        # What still holds the abandoned save's staged state: the DCP stager, and the planner (it keeps the
        # last state dict it planned). DCP's staged DTensors carry copies of the device mesh, and a copied
        # mesh re-registers the training group: kept alive, it would keep the aborted group's sockets open.
        if self._dcp_stager is not None:
            self._dcp_stager.close()
            self._dcp_stager = None
        self._planner.forget()
        self._planner = ScopedSavePlanner()
        return stopped

    def close(self, *, drain: bool = True) -> None:
        """Drain, stop the writer thread, release the hook, the staging memory, the cached DCP plans and
        the process group.

        drain=False (in-process restart, after the process groups were aborted): abandon the in-flight
        save and wait (at most `pg_timeout_s`) for its thread to stop; the step stays uncommitted."""
        if drain:
            self.wait()
        else:
            self.abandon()
        if self._worker is not None:
            if not self._worker.close(timeout_s=None if drain else self.cfg.pg_timeout_s):
                log.warning(
                    "the abandoned checkpoint writer did not stop within %.0f s; it can no longer commit",
                    self.cfg.pg_timeout_s,
                )
            self._worker = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._stager is not None:
            self._stager.close()
        if self._dcp_stager is not None:
            self._dcp_stager.close()
            self._dcp_stager = None
        self._planner.forget()
        self._comm.close()

    # ---------------------------------------------------------------------------------------- loading
    def load(self, state: dict[str, Any]) -> int | None:
        """Restore the newest committed step whose files verify into `state`; None if none is committed.

        Falls back to an older step (warning + `resume` event with fallback_from) when the newest is
        damaged; raises CheckpointError (one line) when steps are committed but none verifies."""
        if self.cfg.mode == "off":
            return None
        self.wait()
        t0 = time.time()
        if self._tiers is not None and (restored := self._load_from_tiers(state)) is not None:
            return restored
        read_before = SHARED_READS.bytes
        result = resume(
            self._comm, self.root, state, checksum=self.cfg.verify == "checksum", policy=self.reshard
        )
        self.last_source = "shared" if result.step is not None else "none"
        self.events.emit(
            "resume",
            step=result.step,
            source=self.last_source,
            duration_s=time.time() - t0,
            fallback_from=result.fallback_from,
            shared_bytes=SHARED_READS.bytes - read_before,
            resharded_from=result.resharded_from,
            ts=t0,
        )
        if result.resharded_from is not None:
            self._report_reshard(result.step, result.resharded_from, time.time() - t0)
        if result.fallback_from is not None and self.rank == 0:
            log.warning(
                "resumed from step %d, not the newest committed step %d (damaged: %s)",
                result.step,
                result.fallback_from,
                result.rejected.get(result.fallback_from),
            )
        self._last_step = result.step
        return result.step

    def _report_reshard(self, step: int | None, from_world: int, duration_s: float) -> None:
        """The `resharded` event (every rank) and one line (rank 0)."""
        self.events.emit(
            "resharded", step=step, from_world=from_world, to_world=self.world_size,
            global_batch=self.reshard.global_batch, duration_s=duration_s,
        )  # fmt: skip
        if self.rank == 0:
            log.warning(
                "resharded from %d to %d ranks at step %s (global batch %s samples per optimizer step kept)",
                from_world, self.world_size, step, self.reshard.global_batch,
            )  # fmt: skip

    def _load_from_tiers(self, state: dict[str, Any]) -> int | None:
        """The newest committed step from the memory tiers (every rank, or none: see MemoryTiers.restore);
        None when shared storage must serve it (rank 0 says why, once)."""
        newest = None
        if self.rank == 0:
            newest = max((s for s in list_steps(self.root) if is_committed(self.root, s)), default=None)
        newest = self._comm.broadcast_from_zero(newest)
        if newest is None:
            return None
        t0 = time.time()
        got = self._tiers.restore(self._comm, state, newest)
        if isinstance(got, TierRestore):
            self.last_source = got.source
            self._last_step = got.step
            self.events.emit(
                "resume", step=got.step, source=got.source, duration_s=time.time() - t0, bytes=got.bytes,
                shared_bytes=0, fallback_from=None, ts=t0,
            )  # fmt: skip
            return got.step
        if self.rank == 0:
            log.warning(
                "checkpoint memory tiers cannot restore step %d (%s): reading shared storage", newest, got
            )
            self.events.emit("tier", step=newest, phase="fallback", reason=got[:500])
        return None

    def memory_step(self) -> int | None:
        """Step held in host memory by the last async (kit) save, for in-process restart; None if none.
        Each rank answers for itself: restore from memory only if every rank reports the same step."""
        if self._stager is None:
            return None
        save = self._inflight
        if save is not None:
            with self._on_wait():
                save.staged.wait()  # a local memcpy (or abandoned): always finishes
        return self._stager.last_step

    def load_from_memory(self, state: dict[str, Any]) -> int | None:
        """Copy the host copy of the last async save back into `state`; its step, or None if none."""
        step = self.memory_step()
        if step is None:
            return None
        t0 = time.time()
        restore_into(state, self._stager.last)
        self.events.emit(
            "resume", step=step, source="memory", duration_s=time.time() - t0, fallback_from=None, ts=t0
        )
        self._last_step = step
        return step
