"""Node ranks, shared by both rendezvous backends: kept across rounds, spares by index, the ring by rank."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


def stable_ranks(previous: dict[Node, int], nodes: list[Node]) -> dict[Node, int]:
    """Ranks 0..len(nodes)-1 for `nodes` (sorted, as torch orders them): a node of the previous round keeps
    its rank when it is still free and in range; the others take the free ranks in order.

    Why: a rank's memory-tier copy of its checkpoint shard, and its buddy's, are kept by rank
    (fsdpkit.resilience.checkpoint.tier). torch numbers the nodes of every round by their sorted addresses,
    so a spare that sorts between two survivors would shift one survivor to another rank, whose shard is
    then on another node. Kept ranks mean a survivor restores from its own memory and only the newcomer
    fetches the lost node's shards (from the lost node's buddy)."""
    size = len(nodes)
    ranks: dict[Node, int] = {}
    for node in nodes:
        rank = previous.get(node)
        if rank is not None and rank < size and rank not in ranks.values():
            ranks[node] = rank
    free = iter(sorted(set(range(size)) - set(ranks.values())))
    for node in nodes:
        if node not in ranks:
            ranks[node] = next(free)
    return ranks


def is_spare(node_rank: int, nodes: int) -> bool:
    """Whether the pod of index `node_rank` is a hot spare: the first `nodes` pods train."""
    return node_rank >= nodes


def ring_after(members: dict[str, int], node: str, count: int) -> list[str]:
    """Up to `count` members after `node` by rank, around the ring ([] if `node` is not a member)."""
    if node not in members:
        return []
    by_rank = {rank: name for name, rank in members.items()}
    mine, world = members[node], len(members)
    return [by_rank[(mine + i) % world] for i in range(1, min(count, world - 1) + 1)]
