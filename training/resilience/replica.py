"""Recovery from a live replica (HSDP): a rank whose live state is lost or torn receives its shard of the
model, the optimizer, the schedule, the step and the data position from a rank of another replica that holds
the same shard, over the network, at the last step that replica completed. No checkpoint file, no memory
tier.

When a step is complete. A rank's step is complete once its optimizer update has finished (the optimizer,
the schedule and the step count all applied: `step.update()` exited): from then on its live state IS that
step, whatever happens to the step's report (whose all-reduce carries only what ranks agree on: the mean
loss, the drain flag, the checkpoint interval, which the next report carries again). Before its update a
rank is clean at the step before (its data position and RNG rewound to the step's start); inside its update
it is torn. The gradients of a step are reduced over every replica before any rank's update can start (the
backward's reduce-scatter and all-reduce, and the clipping's all-reduce, are collectives of every rank), so
two ranks that completed a step hold bitwise the same shard of it: sending a completed replica's state is
sending the state a fault-free run has at that step.

The agreement (`plan`, the same on every rank from the same reports): the target is the highest step any
rank's live state is clean at; every shard needs a holder at the target, and no rank may be past it (a
rank never moves back without a copy). A rank at the target keeps its own state; every other rank (torn,
behind, or a fresh process) receives from the nearest holder in the following replicas, which spreads the
senders over the replicas. Per-rank state (a per-rank data position, per-rank extras) cannot come from
another rank: such a job does not use this source. Each receiver keeps its own RNG state (the RNG is per
rank; it is taken before the session is rebuilt).

On the wire: the kit's tagged JSON header (`wire`, never a pickle) with each tensor's dtype and shape, checked
against the receiver's own state before a byte of data is accepted, then each tensor's raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fsdpkit.resilience.checkpoint.blob import fits
from fsdpkit.resilience.checkpoint.wire import TensorRef, WireError, decode, encode

HEADER_MAX_BYTES = 64 << 20
"""Largest header a receiver accepts (the tree's plain values and one entry per tensor)."""
_PER_RANK = ("rng.rank", "extra.")


class ReplicaError(RuntimeError):
    """A replica transfer that cannot complete (bytes that are not a state of this shard); one line."""


@dataclass(frozen=True)
class ReplicaPlan:
    step: int
    """The step every rank resumes at: the highest step a live rank completed."""
    senders: tuple[tuple[int, int], ...]
    """(receiver, sender) pairs, by receiver."""

    def sender_of(self, rank: int) -> int | None:
        return next((s for r, s in self.senders if r == rank), None)


def plan(lives: list[int | None], portable: list[bool], *, replicate: int) -> ReplicaPlan | str:
    """The replica restore for these live steps (one per rank, None when torn or lost), or why not."""
    world = len(lives)
    if replicate < 2:
        return "no live replica (parallel.replicate=1)"
    if not all(portable):
        ranks = [r for r, ok in enumerate(portable) if not ok]
        return f"ranks {ranks[:8]} keep per-rank state that only they can restore"
    clean = [s for s in lives if s is not None]
    if not clean:
        return "no rank's live state is clean"
    target, shard = max(clean), world // replicate
    senders: list[tuple[int, int]] = []
    for index in range(shard):
        holders = [r * shard + index for r in range(replicate)]
        at = [h for h in holders if lives[h] == target]
        if not at:
            states = ", ".join(f"rank {h}: {_state(lives[h])}" for h in holders)
            return f"no replica of shard {index} completed step {target} ({states})"
        for h in holders:
            if lives[h] != target:
                nearest = min(at, key=lambda a, h=h: (a // shard - h // shard) % replicate)
                senders.append((h, nearest))
    return ReplicaPlan(target, tuple(sorted(senders)))


def _state(live: int | None) -> str:
    return "torn or lost" if live is None else f"at step {live}"


def shared_part(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` (a flattened state: {state key: state dict}) without the per-rank keys (RNG, extras)."""
    return {
        key: {k: v for k, v in value.items() if not str(k).startswith(_PER_RANK)}
        if isinstance(value, dict)
        else value
        for key, value in tree.items()
    }


def _layout(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if isinstance(obj, DTensor) else obj
        local = local.detach().contiguous()
        tensors.append(local)
        return TensorRef(str(local.dtype).removeprefix("torch."), tuple(local.shape), 0, local.nbytes)
    if isinstance(obj, dict):
        return {k: _layout(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_layout(v, tensors) for v in obj)
    return obj


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (no copy)."""
    return tensor.reshape(-1).view(torch.uint8)


def send(tree: dict[str, Any], to: int) -> int:
    """Send `tree`'s shared part to rank `to` over the current group; the bytes sent."""
    tensors: list[torch.Tensor] = []
    header = encode(_layout(shared_part(tree), tensors))
    dist.send(torch.tensor([len(header)], dtype=torch.int64), to)
    dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8), to)
    sent = len(header)
    for tensor in tensors:
        if tensor.nbytes:
            dist.send(_bytes(tensor.cpu()), to)
            sent += tensor.nbytes
    return sent


def _allocate(obj: Any, out: list[torch.Tensor]) -> Any:
    if isinstance(obj, TensorRef):
        dtype = getattr(torch, obj.dtype)  # `wire` checked that it names a dtype
        tensor = torch.empty(obj.shape, dtype=dtype)
        if tensor.nbytes != obj.nbytes:
            raise ReplicaError(f"a tensor entry ({obj.dtype}, {obj.shape}) says {obj.nbytes} bytes")
        out.append(tensor)
        return tensor
    if isinstance(obj, dict):
        return {k: _allocate(v, out) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_allocate(v, out) for v in obj)
    return obj


def receive(template: dict[str, Any], sender: int) -> tuple[dict[str, Any], int]:
    """Receive the shared part of `sender`'s state, checked against `template` (this rank's own state as
    local tensors) before any tensor's bytes are accepted; (tree, bytes received)."""
    length = torch.zeros(1, dtype=torch.int64)
    dist.recv(length, sender)
    size = int(length.item())
    if not 0 < size <= HEADER_MAX_BYTES:
        raise ReplicaError(f"rank {sender} announced a {size}-byte header (at most {HEADER_MAX_BYTES})")
    header = torch.empty(size, dtype=torch.uint8)
    dist.recv(header, sender)
    try:
        skeleton = decode(header.numpy().tobytes(), tensors=True)
    except WireError as exc:
        raise ReplicaError(f"rank {sender}'s state header is refused: {exc}") from None
    tensors: list[torch.Tensor] = []
    tree = _allocate(skeleton, tensors)
    problem = fits(shared_part(template), tree)
    if problem:
        raise ReplicaError(f"rank {sender}'s state does not fit this rank's shard: {problem}")
    received = size
    for tensor in tensors:
        if tensor.nbytes:
            dist.recv(_bytes(tensor), sender)
            received += tensor.nbytes
    return tree, received


def exchange(
    replica_plan: ReplicaPlan, rank: int, own: dict[str, Any] | None, template: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, int]:
    """Every rank runs the plan's transfers in the same order (by receiver): a sender sends `own` (its live
    state at the plan's step) to each of its receivers; a receiver returns what it got and the bytes."""
    received, nbytes = None, 0
    for receiver, sender in replica_plan.senders:
        if rank == sender:
            assert own is not None, "a sender holds the plan's step"
            nbytes += send(own, receiver)
        elif rank == receiver:
            assert template is not None
            received, nbytes = receive(template, sender)
    return received, nbytes
