"""The checkpoint's own gloo process group, and the few collectives it needs (none without distributed).

Background saves must never share the training process group: their collectives would interleave with
FSDP's and deadlock (reference: torch-on-cpu.md §2.5). Every collective here runs on this group, and once
the group is closed or abandoned (in-process restart) every collective raises SaveAbandoned instead of
falling back to whatever default group exists by then.

Messages between ranks are the kit's tagged JSON (`wire`), carried as bytes in tensors: never
`gather_object` / `broadcast_object_list`, which unpickle whatever a peer sends (a process that joined the
group, not the kit, could run code on every rank). A message that is not the kit's plain values is refused
(WireError, one line naming the sender) on every rank at the same point: a gathered message is sent to every
rank and every rank reads all of them, so no rank waits in a collective the others left.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from fsdpkit.resilience.checkpoint.guard import SaveAbandoned
from fsdpkit.resilience.checkpoint.wire import WireError, decode, encode

SAVE_ERRORS = (Exception, CheckpointException)
"""What a failed save or load can raise: DCP's CheckpointException derives from BaseException, not
Exception, so a plain `except Exception` would let it kill the writer thread."""


MAX_MESSAGE_BYTES = 64 << 20
"""Longest message a rank accepts: the kit's are verdicts and records (kilobytes, ~5 KB per rank for the
tiers' plan); a forged length must not make every rank allocate without bound."""


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
        """Every rank's `obj` on rank 0 (None elsewhere); without distributed, `obj` as it would arrive."""
        data = encode(obj)
        group = self.group
        if not self.distributed:
            return [_receive(data, 0)]
        width = torch.tensor([len(data)], dtype=torch.int64)
        widths = [torch.empty(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(widths, width, group=group)
        longest = max(_width(int(w.item()), r) for r, w in enumerate(widths))
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(parts, _padded(data, longest), group=group)
        got = [
            _receive(p[: int(w.item())].numpy().tobytes(), r)
            for r, (p, w) in enumerate(zip(parts, widths, strict=True))
        ]
        return got if self.rank == 0 else None

    def broadcast_from_zero(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (the others' `obj` is ignored)."""
        data = encode(obj) if self.rank == 0 else b""
        group = self.group
        if not self.distributed:
            return _receive(data, 0)
        src = dist.get_global_rank(group, 0)
        width = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(width, src=src, group=group)
        buf = _padded(data, _width(int(width.item()), 0))
        dist.broadcast(buf, src=src, group=group)
        return _receive(buf.numpy().tobytes(), 0)

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


def _width(width: int, sender: int) -> int:
    """A message's announced length, refused (the same on every rank: all see it) past MAX_MESSAGE_BYTES."""
    if not 0 <= width <= MAX_MESSAGE_BYTES:
        raise WireError(
            f"a message from rank {sender} of the checkpoint group refused: {width} bytes announced"
        )
    return width


def _padded(data: bytes, width: int) -> torch.Tensor:
    """`data` in a uint8 tensor of `width` bytes (zeros after it)."""
    out = torch.zeros(width, dtype=torch.uint8)
    if data:
        out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def _receive(data: bytes, sender: int) -> Any:
    """A message as the kit's plain values; WireError naming the sender if it is anything else."""
    try:
        return decode(data)
    except WireError as exc:
        raise WireError(f"a message from rank {sender} of the checkpoint group refused: {exc}") from None
