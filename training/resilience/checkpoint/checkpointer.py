"""The checkpointer the training loop calls: `maybe_save`, `load`, `wait`, `close` (+ in-memory restore).

It composes one collaborator per job:
  SaveSchedule  (schedule)      when: every `interval` steps, or the `auto` interval all ranks agreed on;
  SavePath      (savers)        how: sync, async kit or async dcp, each ending in SaveFinisher (finish);
  ShardWriter   (shards)        this rank's shard of a step on shared storage, with its own DCP planner;
  TierHook      (tier_hook)     the memory tiers' part of a save and of a restore;
  SaveSlot      (inflight)      the save still in flight, and every wait of the loop on it;
  StagingGate   (staging_gate)  async: every `torch.optim` step waits for the host copy of the state, so no
                                later update reaches the checkpoint; forward and backward overlap it;
  Restorer      (restore)       load on resume, from the tiers or shared storage, or from host memory.

One save at a time. When the next save comes due while the previous one is still being written,
`maybe_save` WAITS for it and times the wait as stall. Why: `checkpoint.interval` is the user's bound on
lost work; skipping would silently double it exactly when storage is slow. The wait is visible (stall
events, a warning that names the fix: a longer interval or faster storage). Skipping would also need a
collective to agree, since ranks may disagree on whether their own write finished (reference:
torch-on-cpu.md §2.5).

Events (`ckpt`, see fsdpkit.runtime.events): stall (loop blocked: in maybe_save, and in the optimizer
pre-hook if the copy was not done), write (this rank's shard durable; duration from the save request), commit
(rank 0, record durable; duration from the request), failed (error; rank 0 for the step, plus each rank
whose own write failed: count distinct steps), drain (`wait()`), skipped (a second save of one step).
A failed save is logged and counted; training goes on.

Every wait of the training thread on a checkpoint (the host copy inside or before an optimizer step, the
previous save, a test hold, the drain) runs inside `on_wait()` (the trainer passes its heartbeat's
"checkpoint" phase), so a slow save never looks like a hang.

In-process restart: `abandon()` (once the process groups are aborted) stops the in-flight save at its
next phase boundary (fsdpkit.resilience.checkpoint.guard): it never writes or commits without its group,
and it is reported as failed ("abandoned"). Its DCP plans are cached under this checkpointer only
(ScopedSavePlanner) and dropped at `close()`, so nothing planned for one group is reused by the next.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from fsdpkit.resilience.checkpoint.comm import CheckpointComm
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.finish import SaveFinisher
from fsdpkit.resilience.checkpoint.guard import SaveGuard, SaveHolds
from fsdpkit.resilience.checkpoint.inflight import InflightSave, SaveSlot
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir
from fsdpkit.resilience.checkpoint.planner import ScopedSavePlanner
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy
from fsdpkit.resilience.checkpoint.restore import Restorer
from fsdpkit.resilience.checkpoint.resume import CheckpointError
from fsdpkit.resilience.checkpoint.savers import SaveParts, save_path
from fsdpkit.resilience.checkpoint.schedule import SaveSchedule
from fsdpkit.resilience.checkpoint.shards import ShardWriter
from fsdpkit.resilience.checkpoint.shared_reads import SHARED_READS
from fsdpkit.resilience.checkpoint.staging import HostStager
from fsdpkit.resilience.checkpoint.staging_gate import StagingGate
from fsdpkit.resilience.checkpoint.tier_hook import TierHook
from fsdpkit.runtime.events import EventLog

__all__ = ["CheckpointError", "Checkpointer"]


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
        self._on_wait = on_wait or contextlib.nullcontext
        self._abandoned = threading.Event()
        self._holds = SaveHolds(run_dir, rank)
        self._schedule = SaveSchedule.from_config(
            cfg, run_dir=run_dir, rank=rank, world_size=world_size, events=self.events, live=live
        )
        self._slot = SaveSlot(self.events, self._on_wait)
        self._tiers = TierHook.from_config(
            cfg, comm=self._comm, rank=rank, world_size=world_size, events=self.events
        )
        self._shards = ShardWriter(
            cfg, root=self.root, rank=rank, world_size=world_size, comm=self._comm, events=self.events
        )
        finisher = SaveFinisher(
            cfg, root=self.root, rank=rank, world_size=world_size, comm=self._comm, events=self.events,
            reshard=self.reshard, tiers=self._tiers, abandoned=self._abandoned,
        )  # fmt: skip
        self._path = save_path(
            cfg,
            SaveParts(shards=self._shards, finisher=finisher, tiers=self._tiers, comm=self._comm),
            rank=rank,
            on_wait=self._on_wait,
        )
        self._gate = StagingGate(self._slot) if self._path.background else None
        self._restorer = Restorer(
            cfg, root=self.root, rank=rank, world_size=world_size, comm=self._comm, events=self.events,
            reshard=self.reshard, tiers=self._tiers, slot=self._slot, stager=self._path.stager,
        )  # fmt: skip
        SHARED_READS.cap(cfg.shared_read_mib_s)
        if cfg.mode != "off" and rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)

    @property
    def last_source(self) -> str | None:
        """Where the last `load` found its state: memory, peer, shared, or none."""
        return self._restorer.last_source

    # The parts that bench/ and the tests look into: the save in flight, the kit's host copy, the planner.
    @property
    def _inflight(self) -> InflightSave | None:
        return self._slot.current

    @property
    def _stager(self) -> HostStager | None:
        return self._path.stager

    @property
    def _planner(self) -> ScopedSavePlanner:
        return self._shards.planner

    # ------------------------------------------------------------------------------------------- when
    def due(self, step: int) -> bool:
        """Whether `maybe_save(step, ...)` will save, so callers can announce it: every `interval` steps
        (step % interval == 0), or with `auto` once the agreed interval has passed since the last save or
        restore (the same on every rank: see fsdpkit.resilience.checkpoint.interval)."""
        return self._schedule.due(step)

    def interval_proposal(self) -> float | None:
        """With `auto`: this rank's share of the interval that train_step's loss all-reduce (SUM) carries
        (rank 0's choice, 0 elsewhere); None with a fixed interval (nothing to carry)."""
        return self._schedule.proposal()

    def agree_interval(self, value: float) -> None:
        """The all-reduced interval (rank 0's choice), the same on every rank: `due` uses it from now on."""
        self._schedule.agree(value)

    # ----------------------------------------------------------------------------------------- saving
    def maybe_save(self, step: int, state: dict[str, Any], *, force: bool = False) -> bool:
        """Save `state` as step `step` if it is due or forced; True if started. With `auto`, rank 0 also
        measures here: the step before this call, and this call's stall (forced final saves excepted)."""
        entered, busy = time.perf_counter(), self._slot.writing()
        started = self._save_if_due(step, state, force=force)
        if self._schedule.measures and not force:
            left, writing = time.perf_counter(), self._slot.writing()
            self._schedule.observe(
                step, entered=entered, left=left, saved=started, busy=busy, writing=writing
            )
        return started

    def _save_if_due(self, step: int, state: dict[str, Any], *, force: bool) -> bool:
        if self.cfg.mode == "off" or not (force or self._schedule.due(step)):
            return False
        if step == self._schedule.last_step:
            self.events.emit("ckpt", step=step, phase="skipped", duration_s=0.0, reason="step already saved")
            return False
        t0 = time.time()
        t0p = time.perf_counter()
        self._slot.wait_previous(step)
        hold = self._holds.claim(step) if self._path.background else None
        save = InflightSave(step=step, t_request=t0, guard=SaveGuard(step, self._abandoned, hold=hold))
        self._schedule.last_step = step
        if self._path.start(save, state):
            self._slot.current = save
        if hold is not None:
            with self._on_wait():
                save.guard.held.wait()
        self.events.emit("ckpt", step=step, phase="stall", duration_s=time.perf_counter() - t0p, ts=t0)
        return True

    def maybe_wait_for_staging(self) -> None:
        """Block until the host copy of the in-flight save is done; call before mutating state in place
        outside `torch.optim` (optimizer steps already wait by themselves)."""
        self._slot.wait_staged()

    # ---------------------------------------------------------------------------------------- waiting
    def wait(self) -> None:
        """Drain: block until the in-flight save is committed or failed (a `drain` event times it)."""
        self._slot.drain()

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
        stopped = self._path.drained(timeout_s, give_up=give_up)
        # What still holds the abandoned save's staged state: the DCP stager, and the planner (it keeps the
        # last state dict it planned).
        self._path.release()
        self._shards.renew_planner()
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
        self._path.close(None if drain else self.cfg.pg_timeout_s)
        if self._gate is not None:
            self._gate.remove()
        self._shards.planner.forget()
        self._comm.close()

    # ---------------------------------------------------------------------------------------- loading
    def load(self, state: dict[str, Any]) -> int | None:
        """Restore the newest committed step whose files verify into `state`; None if none is committed.

        Falls back to an older step (warning + `resume` event with fallback_from) when the newest is
        damaged; raises CheckpointError (one line) when steps are committed but none verifies."""
        if self.cfg.mode == "off":
            return None
        self.wait()
        step = self._restorer.load(state)
        self._schedule.last_step = step
        return step

    def memory_step(self) -> int | None:
        """Step held in host memory by the last async (kit) save, for in-process restart; None if none.
        Each rank answers for itself: restore from memory only if every rank reports the same step."""
        return self._restorer.memory_step()

    def load_from_memory(self, state: dict[str, Any]) -> int | None:
        """Copy the host copy of the last async save back into `state`; its step, or None if none."""
        step = self._restorer.load_from_memory(state)
        if step is not None:
            self._schedule.last_step = step
        return step
