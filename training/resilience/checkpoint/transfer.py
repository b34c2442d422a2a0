"""Moving memory-tier copies between nodes: the buddy copy after each commit, and a lost node's copies to
the node that replaces it. Point-to-point sends on the checkpoint's own gloo group (host memory, TCP; never
the training group), from one node's tier folder into another's, in chunks, verified on arrival.

Buddies form a ring over the nodes: rank r's copy goes to rank r + L (L ranks per node), the same local
rank on the next node, and each rank receives the copy of rank r - L. Why a ring and not cliques (NVRx) or
a spare as the holder: every node sends and receives exactly one node's worth of bytes per save (the
load is even and does not grow with the job), any single node loss leaves one copy of every shard, and a
ring needs no spare (a job without spares still recovers from memory when the Job's replacement pod
arrives). What it does not survive: a node and the next one lost together; then shared storage serves.
"""

from __future__ import annotations

import contextlib
import mmap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training.resilience.checkpoint.comm import CheckpointComm
from training.resilience.checkpoint.commit import CHECKSUMS, WRITTEN_CHECKSUM
from training.resilience.checkpoint.guard import SaveGuard
from training.resilience.checkpoint.tier import NodeTier, TierRecord, incoming, new_record, outgoing

CHUNK_BYTES = 256 << 20
"""Bytes per message: gloo sends each as one buffer; a few hundred MB keeps every message far from any
32-bit limit and lets large copies stream."""
_HEADER = 5
"""step, rank, world size, size, crc32c: what a sender tells its receiver before the bytes."""


class TransferError(RuntimeError):
    """A copy that arrived damaged or was not the one expected; one line."""


def buddy_of(rank: int, world_size: int, local_world_size: int) -> int:
    """The rank that keeps `rank`'s copy: the same local rank on the next node (ring)."""
    return (rank + local_world_size) % world_size


def has_buddy(world_size: int, local_world_size: int) -> bool:
    """A peer copy needs a second node."""
    return world_size > local_world_size


def _chunks(size: int) -> Iterator[tuple[int, int, int]]:
    """(tag, start, end) of each message of a `size`-byte copy."""
    for tag, start in enumerate(range(0, size, CHUNK_BYTES)):
        yield tag, start, min(size, start + CHUNK_BYTES)


@contextlib.contextmanager
def _bytes_of(mem: mmap.mmap, size: int) -> Iterator[torch.Tensor]:
    tensor = (
        torch.frombuffer(mem, dtype=torch.uint8, count=size) if size else torch.empty(0, dtype=torch.uint8)
    )
    try:
        yield tensor
    finally:
        del tensor


def _checksum(mem: mmap.mmap, size: int) -> int:
    view = memoryview(mem)[:size]
    try:
        return CHECKSUMS[WRITTEN_CHECKSUM](view, 0)
    finally:
        view.release()


@dataclass
class _Send:
    mem: mmap.mmap
    size: int
    to: int


@dataclass
class _Receive:
    mem: mmap.mmap
    expected: TierRecord
    sender: int


def _post(comm: CheckpointComm, sends: list[_Send], receives: list[_Receive]) -> None:
    """Post every chunk of every send and receive at once, then wait for all of them."""
    group = comm.group
    works = []
    tensors: list[torch.Tensor] = []
    with contextlib.ExitStack() as stack:
        for item in receives:
            whole = stack.enter_context(_bytes_of(item.mem, item.expected.size))
            for tag, a, b in _chunks(item.expected.size):
                view = whole[a:b]
                tensors.append(view)
                works.append(
                    dist.irecv(view, src=dist.get_global_rank(group, item.sender), group=group, tag=tag)
                )
        for item in sends:
            whole = stack.enter_context(_bytes_of(item.mem, item.size))
            for tag, a, b in _chunks(item.size):
                view = whole[a:b]
                tensors.append(view)
                works.append(dist.isend(view, dst=dist.get_global_rank(group, item.to), group=group, tag=tag))
        try:
            for work in works:
                work.wait()
        finally:
            tensors.clear()
            works.clear()


def _accept(tier: NodeTier, item: _Receive) -> TierRecord:
    """Verify an arrived copy against the sender's record; publish it with its own record."""
    record = item.expected
    value = _checksum(item.mem, record.size)
    item.mem.close()
    if value != record.crc32c:
        tier.pending(record.step, record.rank).unlink(missing_ok=True)
        raise TransferError(
            f"rank {record.rank}'s copy of step {record.step} from rank {item.sender} arrived damaged "
            f"(crc32c {value:08x} != {record.crc32c:08x})"
        )
    tier.publish(record.step, record.rank)
    mine = new_record(
        record.entry, step=record.step, rank=record.rank, world_size=record.world_size, origin="peer"
    )
    tier.commit(mine)
    return mine


def replicate(
    comm: CheckpointComm,
    tier: NodeTier,
    own: TierRecord,
    *,
    local_world_size: int,
    guard: SaveGuard | None = None,
) -> TierRecord:
    """Collective over the checkpoint group, right after every rank committed its own copy of the step:
    send `own` to this rank's buddy, receive the copy of the rank whose buddy this rank is; the record of
    the received copy. TransferError if it arrived damaged or is not of this step."""
    world = comm.world_size
    dst = buddy_of(comm.rank, world, local_world_size)
    src = (comm.rank - local_world_size) % world
    group = comm.group
    mine = torch.tensor([own.step, own.rank, own.world_size, own.size, own.crc32c], dtype=torch.int64)
    theirs = torch.empty(_HEADER, dtype=torch.int64)
    works = [
        dist.irecv(theirs, src=dist.get_global_rank(group, src), group=group),
        dist.isend(mine, dst=dist.get_global_rank(group, dst), group=group),
    ]
    for work in works:
        work.wait()
    step, rank, world_size, size, crc = (int(x) for x in theirs.tolist())
    if (step, rank, world_size) != (own.step, src, world):
        raise TransferError(
            f"rank {src} offered rank {rank}'s copy of step {step} (world {world_size}); expected rank "
            f"{src}'s of step {own.step} (world {world})"
        )
    if guard is not None:
        guard.point("replicating")
    expected = TierRecord(step=step, rank=rank, world_size=world_size, size=size, crc32c=crc, origin="own")
    receive = _Receive(mem=incoming(tier.pending(step, rank), size), expected=expected, sender=src)
    send = _Send(mem=outgoing(tier.blob(own.step, own.rank)), size=own.size, to=dst)
    try:
        _post(comm, [send], [receive])
    except BaseException:
        receive.mem.close()
        tier.pending(step, rank).unlink(missing_ok=True)
        raise
    finally:
        send.mem.close()
    return _accept(tier, receive)


def plan_sources(held: list[set[int]], world_size: int) -> tuple[dict[int, int | None], list[int]]:
    """Where each rank's copy comes from: `held[q]` is the set of ranks whose copy the node of rank q
    holds. Rank r reads its own node's copy when there is one (None), else the copy of another rank's node
    (the least loaded sender, then the lowest rank); ranks whose copy no node holds are returned apart."""
    plan: dict[int, int | None] = {}
    missing: list[int] = []
    load: Counter[int] = Counter()
    for rank in range(world_size):
        if rank in held[rank]:
            plan[rank] = None
            continue
        senders = [q for q in range(world_size) if rank in held[q]]
        if not senders:
            missing.append(rank)
            continue
        sender = min(senders, key=lambda q: (load[q], q))
        load[sender] += 1
        plan[rank] = sender
    return plan, missing


def fetch(
    comm: CheckpointComm,
    tier: NodeTier,
    step: int,
    plan: dict[int, int | None],
    records: dict[int, TierRecord],
) -> TierRecord | None:
    """Collective: every planned copy goes from its sender's node to its rank's node (a rank receives at
    most its own; a rank may send several). The record of the copy this rank received, or None."""
    sends, receives = [], []
    try:
        for rank, sender in sorted(plan.items()):
            if sender is None:
                continue
            if sender == comm.rank:
                held = tier.record(step, rank)
                if held is None:
                    raise TransferError(f"rank {comm.rank} was to send rank {rank}'s copy, which is gone")
                sends.append(_Send(mem=outgoing(tier.blob(step, rank)), size=held.size, to=rank))
            if rank == comm.rank:
                expected = records[rank]
                receives.append(
                    _Receive(
                        mem=incoming(tier.pending(step, rank), expected.size),
                        expected=expected,
                        sender=sender,
                    )
                )
        _post(comm, sends, receives)
    except BaseException:
        for item in receives:
            item.mem.close()
            tier.pending(step, item.expected.rank).unlink(missing_ok=True)
        raise
    finally:
        for item in sends:
            item.mem.close()
    return _accept(tier, receives[0]) if receives else None
