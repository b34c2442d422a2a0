"""The checkpointer's memory tiers (config `checkpoint.tiers`): what a save leaves in memory, and the
restore that reads it back instead of shared storage.

Saving, on the writer thread (off the training loop): each rank's host copy of its state is staged
straight into its blob in its node's tier (fsdpkit.resilience.checkpoint.tier; `reserve`, then the stager
copies, the shard is written from it, and `seal` checksums it and writes its record), or, where the state
is on a GPU or the save is synchronous, written as a blob after the shard (`write`); once rank 0 has
committed the step on shared storage and every rank's blob is written, each rank sends its copy to its
buddy on the next node and receives its other neighbour's (fsdpkit.resilience.checkpoint.transfer),
then keeps only the newest `tier_keep` steps. A rank that could not write its copy costs the tier that
step, never the save: the shared tier is unchanged and stays what a new job, another world size or a
second failure reads.

Restoring, in `Checkpointer.load` before shared storage: the step must be the newest one committed on
shared storage, and every rank's copy of it must be on some node that is still in the job. Rank 0 gathers
what each node holds and plans: a rank reads its own node's copy (`memory`), or has it sent by a node
that holds it (`peer`: a spare that replaced a lost node gets the lost node's copies from their buddy).
Every copy is verified against its record (size, and CRC-32C with `checkpoint.verify=checksum`; a sent
copy always on arrival) and checked against the live state's shapes before any rank copies anything in;
if any rank cannot, every rank falls back to shared storage, and rank 0 says why in one line.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from fsdpkit.resilience.checkpoint.blob import (
    BlobError,
    BlobLayout,
    fits,
    open_blob,
    plan_blob,
    seal_blob,
    stage_blob,
    write_blob,
)
from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.guard import SaveAbandoned, SaveGuard
from fsdpkit.resilience.checkpoint.staging import flatten_state, restore_into
from fsdpkit.resilience.checkpoint.tier import TIER_DIR_ENV, NodeTier, TierRecord, new_record
from fsdpkit.resilience.checkpoint.transfer import TransferError, fetch, has_buddy, plan_sources, replicate
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("fsdpkit.resilience.checkpoint")

Source = Literal["memory", "peer"]


@dataclass
class StagedBlob:
    """This rank's copy of a step being staged in its node's tier: the file's map, its layout, and one
    host tensor per tensor of the state (views into the map) for the stager to copy into."""

    step: int
    mem: mmap.mmap
    layout: BlobLayout
    views: list[torch.Tensor]
    spent_s: float
    """Seconds spent laying it out (the `write` event counts them)."""


@dataclass(frozen=True)
class TierRestore:
    """What this rank restored from the tiers."""

    step: int
    source: Source
    """memory: its own node's copy; peer: a copy another node sent."""
    bytes: int
    duration_s: float


def resolve(
    cfg: CheckpointConfig, *, world_size: int, local_world_size: int
) -> tuple[bool, bool, str | None]:
    """(local tier on, peer tier on, why not as asked or None), from the config and this process's place:
    the tiers need the kit launcher's node folder (`$KIT_TIER_DIR`) and the kit writer; a peer copy needs a
    second node."""
    if cfg.tiers == "off" or cfg.mode == "off":
        return False, False, None
    if cfg.mode == "async" and cfg.backend != "kit":
        return False, False, f"checkpoint.backend {cfg.backend} writes through DCP's own staging"
    if not os.environ.get(TIER_DIR_ENV):
        return False, False, f"no node tier folder (${TIER_DIR_ENV}: the kit launcher makes one per node)"
    peer = cfg.tiers in ("auto", "peer")
    if peer and not has_buddy(world_size, local_world_size):
        return True, False, "one node: no buddy to hold a peer copy"
    return True, peer, None


class MemoryTiers:
    """This rank's side of the node-local and peer tiers."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        local_world_size: int,
        peer: bool,
        keep: int,
        checksum: bool,
        events: EventLog,
    ) -> None:
        self.tier = NodeTier(root)
        self.rank = rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.peer = peer
        self.keep = keep
        self.checksum = checksum
        self.events = events

    @classmethod
    def from_config(
        cls, cfg: CheckpointConfig, *, rank: int, world_size: int, events: EventLog
    ) -> MemoryTiers | None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)) or world_size)
        local, peer, why = resolve(cfg, world_size=world_size, local_world_size=local_world_size)
        if why and rank == 0:  # asked for explicitly: a warning; `auto` takes what this job can have
            level = logging.INFO if cfg.tiers == "auto" else logging.WARNING
            log.log(level, "checkpoint memory tiers: %s%s", "peer copies off: " if local else "off: ", why)
        if not local:
            return None
        return cls(
            os.environ[TIER_DIR_ENV],
            rank=rank,
            world_size=world_size,
            local_world_size=local_world_size,
            peer=peer,
            keep=cfg.tier_keep,
            checksum=cfg.verify == "checksum",
            events=events,
        )

    # --------------------------------------------------------------------------------------------- saving
    def write(self, step: int, tree: dict[str, Any], guard: SaveGuard | None) -> bool:
        """Writer thread, after this rank's shard is written: its copy of `step`, record last; False if it
        failed (said once, with the reason; the save goes on). An older copy of the same step (saved again
        after a restart) loses its record first, so a write that fails leaves no copy of the step."""
        t0 = time.time()
        self.tier.drop(step, self.rank)
        path = self.tier.recycle(step, self.rank)  # the spare's pages: the tier never holds a third copy
        try:
            entry = write_blob(path, tree, guard=guard)
            self.tier.publish(step, self.rank)
            self.tier.commit(
                new_record(entry, step=step, rank=self.rank, world_size=self.world_size, origin="own")
            )
        except SaveAbandoned:
            path.unlink(missing_ok=True)
            raise
        except (OSError, RuntimeError, TypeError, ValueError) as exc:  # e.g. /dev/shm full
            path.unlink(missing_ok=True)
            self._failed(step, "write", f"{type(exc).__name__}: {exc}")
            return False
        self.events.emit("tier", step=step, phase="write", duration_s=time.time() - t0, bytes=entry.size)
        return True

    def reserve(self, step: int, tree: dict[str, Any]) -> StagedBlob | None:
        """Writer thread, before the host copy: this rank's copy of `step` laid out in its node's tier (a
        recycled file, in a kept map) for the stager to copy `tree` (the state, live tensors) into; None
        if the tier cannot keep it (said once, with the reason; the save goes on, staged elsewhere). An
        older copy of the same step loses its record first, as in `write`."""
        t0 = time.time()
        self.tier.drop(step, self.rank)
        try:
            layout, _ = plan_blob(tree)
            mem = self.tier.map_writable(self.tier.recycle(step, self.rank), layout.size)
            views = stage_blob(mem, layout)
        except (OSError, TypeError, ValueError) as exc:  # e.g. /dev/shm full, a leaf JSON cannot hold
            self.tier.discard(step, self.rank)
            self._failed(step, "write", f"{type(exc).__name__}: {exc}")
            return None
        return StagedBlob(step=step, mem=mem, layout=layout, views=views, spent_s=time.time() - t0)

    def seal(self, staged: StagedBlob) -> bool:
        """Writer thread, after this rank's shard is written from the staged copy: its checksum, then its
        record (from now on the copy exists, once the step is committed); False if that failed."""
        t0 = time.time()
        try:
            entry = seal_blob(staged.mem, staged.layout)
            self.tier.publish(staged.step, self.rank)
            self.tier.commit(
                new_record(entry, step=staged.step, rank=self.rank, world_size=self.world_size, origin="own")
            )
        except OSError as exc:
            self.discard(staged.step)
            self._failed(staged.step, "write", f"{type(exc).__name__}: {exc}")
            return False
        self.events.emit(
            "tier", step=staged.step, phase="write", duration_s=staged.spent_s + time.time() - t0,
            bytes=entry.size, staged=True,
        )  # fmt: skip
        return True

    def discard(self, step: int) -> None:
        """A staged copy that will not be sealed (the save failed or was abandoned): no record, deleted."""
        self.tier.record_path(step, self.rank).unlink(missing_ok=True)
        self.tier.discard(step, self.rank)
        self.tier.drop(step, self.rank)

    def replicate(self, comm: CheckpointComm, step: int, guard: SaveGuard | None) -> None:
        """Every rank (a collective), once every rank's copy of `step` is written (agreed by the caller):
        send this rank's copy to its buddy and receive its neighbour's, then keep the newest steps."""
        own = self.tier.record(step, self.rank)
        if self.peer:
            t0 = time.time()
            try:
                got = replicate(comm, self.tier, own, local_world_size=self.local_world_size, guard=guard)
            except SaveAbandoned:
                raise
            except (TransferError, *SAVE_ERRORS) as exc:
                self._failed(step, "peer", f"{type(exc).__name__}: {exc}")
            else:
                self.events.emit(
                    "tier", step=step, phase="peer", duration_s=time.time() - t0,
                    bytes=(own.size if own else 0) + (got.size if got else 0),
                    held_for=None if got is None else got.rank,
                )  # fmt: skip
        self.tier.prune(keep=self.keep, newest=step)

    def forget(self, step: int) -> None:
        """Some rank has no copy of `step`: this rank's copy of it never counts."""
        self.tier.drop(step, self.rank)

    def _failed(self, step: int, phase: str, error: str) -> None:
        log.warning(
            "checkpoint memory tier, step %d (%s): %s; the shared tier serves this step", step, phase, error
        )
        self.events.emit("tier", step=step, phase="failed", stage=phase, error=error[:300])

    # -------------------------------------------------------------------------------------------- restore
    def restore(self, comm: CheckpointComm, state: dict[str, Any], step: int) -> TierRestore | str:
        """Collective: restore `step` into `state` from the tiers, or the reason (the same on every rank)
        why shared storage must serve it. Nothing is copied into `state` unless every rank can restore."""
        t0 = time.time()
        copies = self.tier.held(step)
        held = {r: rec for r, rec in copies.items() if rec.world_size == comm.world_size}
        resized = {rec.world_size for rec in copies.values()} - {comm.world_size}
        gathered = comm.gather_to_zero((held, resized))
        plan: dict[int, int | None] = {}
        records: dict[int, TierRecord] = {}
        why = None
        if gathered is not None:
            plan, missing = plan_sources([set(h) for h, _ in gathered], comm.world_size)
            for holder, _ in gathered:
                for rank, record in holder.items():
                    records.setdefault(rank, record)
            sizes = sorted(set().union(*(r for _, r in gathered)))
            if missing and sizes:  # a world that changed size: the copies are another world's shards
                why = (
                    f"the copies of step {step} were written by {sizes[0]} rank(s), this job has "
                    f"{comm.world_size}: the shared tier reshards it"
                )
            elif missing:
                why = _missing_reason(step, missing, comm.world_size)
        why, plan, records = comm.broadcast_from_zero((why, plan, records))
        if why:
            return why
        problem = None
        try:
            fetch(comm, self.tier, step, plan, records)
        except TransferError as exc:
            problem = str(exc)
        blob = None
        mine = self.tier.record(step, comm.rank)
        if problem is None:
            if mine is None:
                problem = f"rank {comm.rank}: its copy of step {step} is gone"
            elif plan[comm.rank] is None:
                problem = self.tier.verify(mine, checksum=self.checksum)
        if problem is None:
            try:
                blob = open_blob(self.tier.blob(step, comm.rank))
                problem = fits(flatten_state(state), blob.tree)
            except (OSError, BlobError) as exc:
                problem = str(exc)
        verdict = _agree(comm, None if problem is None else f"rank {comm.rank}: {problem}")
        if verdict is not None:
            if blob is not None:
                blob.close()
            if problem is not None and mine is not None:
                self.tier.drop(step, comm.rank)  # a bad copy is never offered again
            return verdict
        assert blob is not None and mine is not None
        try:
            restore_into(state, blob.tree)
        finally:
            blob.close()
        source: Source = "memory" if plan[comm.rank] is None else "peer"
        return TierRestore(step=step, source=source, bytes=mine.size, duration_s=time.time() - t0)


def _agree(comm: CheckpointComm, problem: str | None) -> str | None:
    """Every rank's problem joined into one line (None if none), the same on every rank."""
    gathered = comm.gather_to_zero(problem)
    joined = None
    if gathered is not None:
        joined = "; ".join(p for p in gathered if p) or None
    return comm.broadcast_from_zero(joined)


def _missing_reason(step: int, missing: list[int], world: int) -> str:
    """Why some ranks' copies of `step` are on no node, for the one line rank 0 writes."""
    ranks = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
    return (
        f"no node in the job holds a copy of step {step} for rank(s) {ranks} ({len(missing)} of {world}: "
        "their node and its buddy were both replaced, or their copies are of an older step)"
    )
