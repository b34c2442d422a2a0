"""Substitution (`--rank-restart in-place`): a newcomer takes a lost node's place in the running round.

Without it, a lost node makes every survivor restart its workers into a new round, and the state comes back
from the memory tiers at the last commit. With HSDP and in-process restart, the survivors' workers are alive
(waiting in their in-process restart for the lost ranks) and hold every shard the lost node held on another
replica: a newcomer that takes the lost node's ranks in the same round lets them restore from those replicas
instead (fsdpkit.resilience.replica), and no survivor restarts anything.

A newcomer waiting in the pool (a hot spare, or the Job's replacement pod) looks every LOOK_EVERY_S for a
member of the last round whose beat says it is gone (the failure detector's rule), claims its place once
(`compare_set` on `r<t>/substitute/<lost node>`: one newcomer per place), rewrites the round's result with
itself under the lost node's rank (`compare_set`, again when another substitution got there first), and
joins that round: torchelastic's agent reads the worker ranks the round's rank-0 agent assigned when it
formed, and its workers start with KIT_REJOIN set (they join the survivors' in-process restart). In this
mode the workers keep their keys (process groups, the in-process barrier) in the rendezvous store, scoped
by round, not in a store rank 0 hosts: the node holding rank 0 is replaced like any other.

A node judged gone that was only late (its beat stalled past its limit) is replaced all the same: its
workers are still in the group, so no in-process restart opens for the newcomer's workers to join; they give
up after `inprocess.barrier_timeout_s`, its launcher joins the next round, the survivors re-form it, and the
late node comes back as a spare. A false verdict costs one group restart, as it does without substitution.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Protocol

from torch.distributed.elastic.rendezvous import RendezvousInfo

from fsdpkit.contracts import env
from fsdpkit.launcher.rendezvous.liveness import FailureDetector
from fsdpkit.launcher.rendezvous.rounds import result_bytes
from fsdpkit.launcher.rendezvous.store_link import Keys, StoreLink


class Newcomer(Protocol):
    """What a substitution needs of the rendezvous handler (KitRendezvous)."""

    node: str
    keys: Keys
    link: StoreLink
    detector: FailureDetector

    def enter(self, t: int, result: dict[str, Any]) -> RendezvousInfo | None: ...


log = logging.getLogger("kit.launch")

LOOK_EVERY_S = 0.25
"""A waiting newcomer's time between two looks for a lost node, in a round of up to LOOK_NODES nodes."""
LOOK_NODES = 64
"""A look reads every member's beat (one `multi_get`): beyond LOOK_NODES members the looks are spaced out
so that a newcomer reads at most LOOK_NODES / LOOK_EVERY_S beats a second (1,024 nodes: a look every 4 s)."""


def look_every_s(members: int) -> float:
    """Seconds between a newcomer's looks for a lost node in a round of `members` nodes."""
    return LOOK_EVERY_S * max(1.0, members / LOOK_NODES)


RESULT_TRIES = 8


def take_place(handler: Newcomer, last: int, members: dict[str, int]) -> RendezvousInfo | None:
    """This node's info in round `last` in a lost node's place, or None (no place to take)."""
    if not last or not members:
        return None
    gone = handler.detector.first_gone(sorted(members, key=members.__getitem__))
    if gone is None:
        return None
    lost, why = gone
    keys, link = handler.keys, handler.link
    if link.claim(keys.round(last, f"substitute/{lost}"), None, handler.node) != handler.node:
        return None  # another newcomer took this place
    result = _rewrite(handler, last, lost)
    if result is None:
        return None
    log.warning(
        "kit-launch: node %s of round %d is gone (%s): taking its place (rank %d) in the running round; "
        "its workers rejoin the survivors' in-process restart",
        lost, last, why, result["ranks"][handler.node],
    )  # fmt: skip
    os.environ[env.REJOIN] = "substitute"  # for this start of the workers only (next_rendezvous clears it)
    return handler.enter(last, result)


def _rewrite(handler: Newcomer, last: int, lost: str) -> dict | None:
    """The round's result with this node under `lost`'s rank, written atomically; None if `lost` is no
    longer in it (the round was re-formed meanwhile)."""
    key, link = handler.keys.round(last, "result"), handler.link
    for _ in range(RESULT_TRIES):
        raw = link.read(key)
        if raw is None:
            return None
        result = json.loads(raw)
        ranks, addrs = dict(result["ranks"]), dict(result["addrs"])
        if lost not in ranks:
            return None
        ranks[handler.node] = ranks.pop(lost)
        addrs[handler.node] = addrs.pop(lost)
        new = result_bytes(ranks, addrs)
        if link.claim(key, raw, new) == new:
            return {"ranks": ranks, "addrs": addrs}
    return None
