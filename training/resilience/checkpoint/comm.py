"""The checkpoint's own gloo process group, and the few collectives it needs (none without distributed).

Background saves must never share the training process group: their collectives would interleave with
FSDP's and deadlock (reference: torch-on-cpu.md §2.5). Every collective here runs on this group, and once
the group is closed or abandoned (in-process restart) every collective raises SaveAbandoned instead of
falling back to whatever default group exists by then.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from fsdpkit.resilience.checkpoint.guard import SaveAbandoned

SAVE_ERRORS = (Exception, CheckpointException)
"""What a failed save or load can raise: DCP's CheckpointException derives from BaseException, not
Exception, so a plain `except Exception` would let it kill the writer thread."""


class CheckpointComm:
    """Rank, world size and a dedicated gloo group; every method is a collective over that group."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.distributed = dist.is_available() and dist.is_initialized() and world_size > 1
        self._group: dist.ProcessGroup | None = None
        self._gone = False
        if self.distributed:
            # A collective: every rank builds its Checkpointer at the same point.
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The checkpoint group (None without distributed); SaveAbandoned once it is gone.

        Gone also means aborted with every other group of this process: an in-process restart aborts them
        all before it abandons the save, and a collective the writer starts in between would wait for a
        peer that never comes (a gloo group aborted here keeps its sockets open while the writer holds it,
        so the peer's own collectives on the training group hang too: both ranks stuck until the process
        exits)."""
        if self._gone or (self.distributed and not dist.is_initialized()):
            raise SaveAbandoned("the checkpoint process group is gone (closed, abandoned or aborted)")
        return self._group

    def abandon(self) -> None:
        """From now on every collective raises. The caller aborts the group; it is forgotten here at once,
        because an aborted gloo group keeps its sockets open (a peer blocked in it would hang) until its
        last reference is gone."""
        self._gone = True
        self._group = None

    def gather_to_zero(self, obj: Any) -> list[Any] | None:
        group = self.group
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=dist.get_global_rank(group, 0), group=group)
        return out

    def broadcast_from_zero(self, obj: Any) -> Any:
        group = self.group
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        return box[0]

    def all_true(self, flag: bool) -> bool:
        group = self.group
        if not self.distributed:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return bool(t.item())

    def barrier(self) -> None:
        group = self.group
        if self.distributed:
            dist.barrier(group=group)

    def close(self) -> None:
        self._gone = True
        if self._group is not None:
            # The default group may already be gone (shutdown order); then there is nothing to free.
            with contextlib.suppress(RuntimeError, ValueError):
                dist.destroy_process_group(self._group)
            self._group = None
