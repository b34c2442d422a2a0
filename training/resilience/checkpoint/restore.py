"""Restore on resume, fastest source first: the memory tiers, else shared storage (falling back to an older
step when the newest is damaged, resharding when the world size changed); or, for an in-process restart,
the host copy of the last async save. Every restore names its source in a `resume` event.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from fsdpkit.resilience.checkpoint.comm import CheckpointComm
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.inflight import SaveSlot
from fsdpkit.resilience.checkpoint.layout import is_committed, list_steps
from fsdpkit.resilience.checkpoint.memory_tiers import TierRestore
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy
from fsdpkit.resilience.checkpoint.resume import resume
from fsdpkit.resilience.checkpoint.shared_reads import SHARED_READS
from fsdpkit.resilience.checkpoint.staging import HostStager, restore_into
from fsdpkit.resilience.checkpoint.tier_hook import TierHook
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("fsdpkit.resilience.checkpoint")


class Restorer:
    """Loads a committed step into a state; `last_source` says where the last `load` found it."""

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
        slot: SaveSlot,
        stager: HostStager | None,
    ) -> None:
        self.cfg = cfg
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.events = events
        self.reshard = reshard
        self._comm = comm
        self._tiers = tiers
        self._slot = slot
        self._stager = stager
        self.last_source: str | None = None
        """memory, peer, shared, or none."""

    def load(self, state: dict[str, Any]) -> int | None:
        """Collective: the newest committed step whose files verify, into `state`; None if none is
        committed. Raises CheckpointError (one line) when steps are committed but none verifies."""
        t0 = time.time()
        if self._tiers.enabled and (restored := self._load_from_tiers(state)) is not None:
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
        got = self._tiers.restore(state, newest)
        if isinstance(got, TierRestore):
            self.last_source = got.source
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
        """Step held in host memory by the last async (kit) save; None if none. Each rank answers for
        itself: restore from memory only if every rank reports the same step."""
        if self._stager is None:
            return None
        self._slot.wait_staged_untimed()
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
        return step
