"""Where a save and a restore meet the memory tiers (fsdpkit.resilience.checkpoint.memory_tiers).

Every call is a no-op without tiers. The tiers are on for every rank or for none: their collectives need
every rank, so one node without a tier turns them off everywhere.
"""

from __future__ import annotations

import logging
from typing import Any

from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.guard import SaveAbandoned
from fsdpkit.resilience.checkpoint.inflight import InflightSave
from fsdpkit.resilience.checkpoint.memory_tiers import MemoryTiers, StagedBlob, TierRestore
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.staging import TakenState
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("fsdpkit.resilience.checkpoint")


class TierHook:
    """This rank's memory tiers as a save and a restore use them; `tiers` None: off."""

    def __init__(self, tiers: MemoryTiers | None, *, comm: CheckpointComm) -> None:
        self.tiers = tiers
        self._comm = comm

    @classmethod
    def from_config(
        cls, cfg: CheckpointConfig, *, comm: CheckpointComm, rank: int, world_size: int, events: EventLog
    ) -> TierHook:
        """Collective (unless mode is off): the tiers this job can have, agreed by every rank."""
        tiers = (
            MemoryTiers.from_config(cfg, rank=rank, world_size=world_size, events=events)
            if cfg.mode != "off"
            else None
        )
        if cfg.mode != "off" and not comm.all_true(tiers is not None) and tiers is not None:
            log.warning("checkpoint memory tiers off: another node has none (see its log)")
            tiers = None  # every rank takes part in the tiers' collectives, or none does
        return cls(tiers, comm=comm)

    @property
    def enabled(self) -> bool:
        return self.tiers is not None

    def write(self, save: InflightSave, tree: dict[str, Any]) -> bool:
        """This rank's memory-tier copy of the step, written after its shard. It counts only once the step
        is committed on shared storage (a restore checks), so it needs no word from rank 0."""
        return self.tiers is not None and self.tiers.write(save.step, tree, save.guard)

    def reserve(self, save: InflightSave, taken: TakenState) -> StagedBlob | None:
        """Before the host copy of an async save: this rank's copy of the step laid out in the tier, to
        stage into (None: stage into the host buffers; with tiers the tier then keeps no copy of this
        step, or, for a state on a GPU, writes it after the shard from the pinned host copy)."""
        if self.tiers is None or taken.ready_event is not None:
            return None
        return self.tiers.reserve(save.step, taken.live_tree())

    def keep(
        self, save: InflightSave, taken: TakenState, staged: StagedBlob | None, tree: Any, ok: bool
    ) -> bool:
        """After the shard of an async save: if it was written (`ok`), this rank's copy of the step, the
        staged one sealed (checksum, record), or for a state on a GPU the host copy `tree` written as a
        blob; else the staged copy is dropped. False: no copy of this step on this rank."""
        if self.tiers is None:
            return False
        if staged is None:  # on a GPU: written from the pinned host copy; else `reserve` said why not
            return ok and taken.ready_event is not None and self.tiers.write(save.step, tree, save.guard)
        if not ok:
            self.tiers.discard(staged.step)
            return False
        return self.tiers.seal(staged)

    def discard(self, staged: StagedBlob | None) -> None:
        """A staged copy whose save stopped before its shard was written."""
        if self.tiers is not None and staged is not None:
            self.tiers.discard(staged.step)

    def agree(self, tiered: bool) -> bool:
        """Collective (with tiers): whether every rank wrote its copy of the step."""
        return self.tiers is not None and self._comm.all_true(tiered)

    def after_commit(self, save: InflightSave, everyone: bool) -> None:
        """Every rank's copy of the step is written (`everyone`): each goes to its buddy (collectives on the
        checkpoint group: a peer that dies fails them at once); else this rank's is dropped (a step that
        some rank lacks is never restored from memory). The shared tier's save is over either way."""
        if self.tiers is None:
            return
        try:
            if everyone:
                self.tiers.replicate(self._comm, save.step, save.guard)
            else:
                self.tiers.forget(save.step)
        except SaveAbandoned as exc:
            log.warning("checkpoint memory tier of step %d abandoned: %s", save.step, exc)
            self.tiers.forget(save.step)
        except SAVE_ERRORS as exc:  # a peer died: its copy of this step may be missing, the commit stands
            log.warning("checkpoint memory tier of step %d: %s", save.step, one_line(exc))

    def restore(self, state: dict[str, Any], step: int) -> TierRestore | str:
        """Collective: `step` into `state` from the tiers (every rank, or none), or why not."""
        if self.tiers is None:
            return "no memory tiers"
        return self.tiers.restore(self._comm, state, step)
