"""Moving memory-tier copies between nodes: the buddy copy after each commit, and a lost node's copies to
the node that replaces it. All-to-all exchanges on the checkpoint's own gloo group in which each rank
sends to one rank only (host memory, TCP; never the training group), from one node's tier folder into
another's, in chunks, verified on arrival.

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

from fsdpkit.resilience.checkpoint.comm import CheckpointComm
from fsdpkit.resilience.checkpoint.commit import CHECKSUMS, WRITTEN_CHECKSUM
from fsdpkit.resilience.checkpoint.guard import SaveGuard
from fsdpkit.resilience.checkpoint.tier import NodeTier, TierRecord, new_record, outgoing

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


@dataclass(frozen=True)
class _Move:
    """One copy going from one rank's node to another's in one round of an exchange."""

    sender: int
    receiver: int
    rank: int
    """Whose copy: the sender's own (buddy copy) or the receiver's (restore)."""
    size: int


def _exchange(
    comm: CheckpointComm,
    moves: list[_Move],
    send: dict[int, mmap.mmap],
    receive: mmap.mmap | None,
    guard: SaveGuard | None,
) -> None:
    """Collective over the checkpoint group: one round of copies, the same `moves` on every rank (each rank
    sends at most one and receives at most one), in chunks, each chunk one all-to-all in which every rank
    sends only to its receiver. `send` maps this rank's receiver to the copy's memory.

    Every rank takes part in every round (an all-gather first tells each what all send), so a rank whose
    copy is missing or damaged cannot leave its buddy waiting in a receive: it sends zeros and says why
    after, and the receiver finds the copy damaged."""
    group = comm.group
    world = comm.world_size
    out_move = next((m for m in moves if m.sender == comm.rank), None)
    in_move = next((m for m in moves if m.receiver == comm.rank), None)
    rounds = max((-(-m.size // CHUNK_BYTES) for m in moves), default=0)
    empty = torch.empty(0, dtype=torch.uint8)
    with contextlib.ExitStack() as stack:
        out_bytes = in_bytes = empty
        if out_move is not None:
            out_bytes = stack.enter_context(_bytes_of(send[out_move.receiver], out_move.size))
        if in_move is not None:
            assert receive is not None
            in_bytes = stack.enter_context(_bytes_of(receive, in_move.size))
        for chunk in range(rounds):
            if guard is not None:
                guard.check()
            in_splits, out_splits = [0] * world, [0] * world
            outgoing_chunk = incoming_chunk = empty
            if out_move is not None:
                a, b = _span(chunk, out_move.size)
                in_splits[out_move.receiver] = b - a
                outgoing_chunk = out_bytes[a:b]
            if in_move is not None:
                a, b = _span(chunk, in_move.size)
                out_splits[in_move.sender] = b - a
                incoming_chunk = in_bytes[a:b]
            dist.all_to_all_single(incoming_chunk, outgoing_chunk, out_splits, in_splits, group=group)
        del out_bytes, in_bytes


def _span(chunk: int, size: int) -> tuple[int, int]:
    """Bytes [a, b) of a `size`-byte copy that chunk number `chunk` carries (empty past its end)."""
    return min(size, chunk * CHUNK_BYTES), min(size, (chunk + 1) * CHUNK_BYTES)


def _accept(tier: NodeTier, mem: mmap.mmap, record: TierRecord, sender: int) -> TierRecord:
    """Verify an arrived copy against the sender's record; publish it with its own record. (`mem` is the
    tier's kept map of the file: left open.)"""
    value = _checksum(mem, record.size)
    if value != record.crc32c:
        tier.discard(record.step, record.rank)
        raise TransferError(
            f"rank {record.rank}'s copy of step {record.step} from rank {sender} arrived damaged "
            f"(crc32c {value:08x} != {record.crc32c:08x})"
        )
    tier.publish(record.step, record.rank)
    mine = new_record(
        record.entry, step=record.step, rank=record.rank, world_size=record.world_size, origin="peer"
    )
    tier.commit(mine)
    return mine


@dataclass
class _Mem:
    """Memory a round sends from or receives into; `owned`: the round closes it (not one of the tier's
    kept maps)."""

    mem: mmap.mmap
    owned: bool

    def close(self) -> None:
        if self.owned:
            self.mem.close()


def _source(tier: NodeTier, step: int, rank: int, size: int) -> tuple[_Mem, str | None]:
    """The memory of `rank`'s copy of `step` to send (the tier's own map of it when this process wrote
    it), or zeros and why not (the exchange is a collective: a rank that cannot send still takes part,
    and its receiver finds the copy damaged)."""
    path = tier.blob(step, rank)
    kept = tier.mapped(path)
    if kept is not None and len(kept) >= size:
        return _Mem(kept, owned=False), None
    try:
        mem = outgoing(path)
    except OSError as exc:
        problem = f"rank {rank}'s copy of step {step} cannot be sent ({exc.strerror or exc})"
    else:
        if len(mem) >= size:
            return _Mem(mem, owned=True), None
        mem.close()
        problem = f"rank {rank}'s copy of step {step} is shorter than its record"
    return _Mem(mmap.mmap(-1, max(size, 1)), owned=True), problem


def _sink(tier: NodeTier, expected: TierRecord) -> tuple[_Mem, str | None]:
    """Where the copy this rank receives goes: its node's tier (a recycled file, in a kept map), or a
    scratch map and why not."""
    try:
        path = tier.recycle(expected.step, expected.rank)
        return _Mem(tier.map_writable(path, expected.size), owned=False), None
    except OSError as exc:
        tier.discard(expected.step, expected.rank)
        problem = f"no room for rank {expected.rank}'s copy of step {expected.step} ({exc.strerror or exc})"
        return _Mem(mmap.mmap(-1, max(expected.size, 1)), owned=True), problem


def _round(
    comm: CheckpointComm,
    tier: NodeTier,
    moves: list[_Move],
    step: int,
    expected: TierRecord | None,
    guard: SaveGuard | None,
    problem: str | None = None,
) -> TierRecord | None:
    """One round of `_exchange`: this rank sends what `moves` has it send (its node's copies of `step`,
    by receiver rank) and receives `expected` into its node's tier, verified and recorded; the record of
    the received copy, or None. Whatever goes wrong locally (`problem`, a copy that cannot be read or
    stored) is raised as TransferError only after the exchange, so no peer is left waiting."""
    problems = [problem] if problem else []
    send: dict[int, _Mem] = {}
    sink = None
    mine = next((m for m in moves if m.receiver == comm.rank), None)
    try:
        for move in moves:
            if move.sender == comm.rank:
                send[move.receiver], why = _source(tier, step, move.rank, move.size)
                problems += [why] if why else []
        if mine is not None and expected is not None:
            sink, why = _sink(tier, expected)
            problems += [why] if why else []
        receive = None if sink is None else sink.mem
        _exchange(comm, moves, {r: m.mem for r, m in send.items()}, receive, guard)
        if problems:
            raise TransferError("; ".join(problems))
        if sink is None or expected is None or mine is None:
            return None
        return _accept(tier, sink.mem, expected, mine.sender)
    except BaseException:
        if sink is not None and expected is not None:
            tier.discard(expected.step, expected.rank)  # no record: never counts
        raise
    finally:
        for mem in send.values():
            mem.close()
        if sink is not None:
            sink.close()


def replicate(
    comm: CheckpointComm,
    tier: NodeTier,
    own: TierRecord | None,
    *,
    local_world_size: int,
    guard: SaveGuard | None = None,
) -> TierRecord | None:
    """Collective over the checkpoint group, once every rank committed its own copy of the step: send
    `own` (None: this rank has none to send) to this rank's buddy, receive the copy of the rank whose
    buddy this rank is; the record of the received copy (None if that rank had none). TransferError if it
    arrived damaged or is not the one expected."""
    world = comm.world_size
    src = (comm.rank - local_world_size) % world
    header = [own.step, own.rank, own.world_size, own.size, own.crc32c] if own is not None else [-1] * _HEADER
    headers = [torch.empty(_HEADER, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(headers, torch.tensor(header, dtype=torch.int64), group=comm.group)
    offered = [[int(x) for x in h.tolist()] for h in headers]
    moves = [
        _Move(sender=r, receiver=buddy_of(r, world, local_world_size), rank=r, size=h[3])
        for r, h in enumerate(offered)
        if h[0] >= 0
    ]
    step, rank, world_size, size, crc = offered[src]
    expected = problem = None
    if step >= 0:
        expected = TierRecord(
            step=step, rank=rank, world_size=world_size, size=size, crc32c=crc, origin="own"
        )
        if own is not None and (step, rank, world_size) != (own.step, src, world):
            problem = (
                f"rank {src} offered rank {rank}'s copy of step {step} (world {world_size}); expected rank "
                f"{src}'s of step {own.step} (world {world})"
            )
    if guard is not None:
        guard.point("replicating")
    return _round(comm, tier, moves, -1 if own is None else own.step, expected, guard, problem)


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
    most its own; a rank may send several, one per round). The record of the copy this rank received, or
    None."""
    by_sender: dict[int, list[int]] = {}
    for rank, sender in sorted(plan.items()):
        if sender is not None:
            by_sender.setdefault(sender, []).append(rank)
    got = None
    for round_ in range(max(map(len, by_sender.values()), default=0)):
        moves = [
            _Move(sender=sender, receiver=ranks[round_], rank=ranks[round_], size=records[ranks[round_]].size)
            for sender, ranks in sorted(by_sender.items())
            if round_ < len(ranks)
        ]
        got = _round(comm, tier, moves, step, records.get(comm.rank), None) or got
    return got
