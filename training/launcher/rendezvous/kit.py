"""The kit's rendezvous handler (`--rdzv-backend=kit`): torch's public `RendezvousHandler`, answered by the
parts beside it (store_link, liveness, rounds, spare_pool).

The membership check (`num_nodes_waiting`, the agent's every monitor interval) is one counter, the number
of nodes that joined the next round: O(1), cached for WAITING_CACHE_S.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from fsdpkit.contracts import env
from fsdpkit.launcher.rendezvous import outcome, substitution
from fsdpkit.launcher.rendezvous.liveness import RING_NEIGHBOURS, Beats, FailureDetector
from fsdpkit.launcher.rendezvous.ranks import ring_after
from fsdpkit.launcher.rendezvous.rounds import WAITING_CACHE_S, Joiner, Membership
from fsdpkit.launcher.rendezvous.settings import Settings
from fsdpkit.launcher.rendezvous.spare_pool import SparePool
from fsdpkit.launcher.rendezvous.store_link import Keys, StoreLink, StoreReset, names_this_machine
from fsdpkit.runtime.run_token import run_key

log = logging.getLogger("kit.launch")

BACKEND = "kit"
MAX_JOINERS_READ = 4096
"""The most join records the membership check reads (a bumped counter must not cost unbounded reads)."""


@dataclass(frozen=True)
class Joined:
    """This node in a complete round: when it asked (`next_rendezvous`) and when the round had it."""

    round: int
    rank: int
    world: int
    asked_at: float
    formed_at: float
    beat_gap_max_s: float
    """The longest gap between two of this node's beats since its previous round."""


def node_id(addr: str) -> str:
    """A name unique to this launcher process: a restarted pod is a new node."""
    return f"{addr}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class KitRendezvous(RendezvousHandler):
    """torch's handler contract plus the agent's calls (`depart`, `gone_neighbour`), each passed to the part
    that owns it: the beats, the failure detector, the rounds, the pool."""

    def __init__(self, link: StoreLink, settings: Settings, *, local_addr: str | None = None) -> None:
        self.link = link
        self.settings = settings
        self.keys = Keys(settings.run_id, link.key)
        self.addr = local_addr or socket.getfqdn()
        self.node = node_id(self.addr)
        self.beats = Beats(link, self.keys, self.node, settings)
        self.detector = FailureDetector(link, self.keys, settings, self.beats)
        self.membership = Membership(link, self.keys, self.node, settings)
        self.pool = SparePool(
            link,
            self.keys,
            self.node,
            settings=settings,
            membership=self.membership,
            check_open=self._raise_if_closed,
        )
        self.joiner = Joiner(
            link,
            self.keys,
            self.node,
            self.addr,
            settings=settings,
            detector=self.detector,
            membership=self.membership,
            check_open=self._raise_if_closed,
        )
        self._waiting_cache: tuple[float, int] = (0.0, 0)
        self.on_round: list[Callable[[Joined], object]] = []
        """Called with a `Joined` each time this node is in a complete round (the launcher's event)."""
        link.on_reconnect.append(self._republish)
        self.beats.beat()
        self.beats.start()

    @property
    def round(self) -> int:
        """The last round this node was part of (0: none yet)."""
        return self.membership.round

    @property
    def members(self) -> dict[str, int]:
        """Node -> rank of the last round this node was part of."""
        return self.membership.members

    # --- RendezvousHandler ------------------------------------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        """In-place mode: the workers keep their keys in the rendezvous store (it outlives every worker and
        node; rank 0's own store would die with rank 0), scoped by round (`KIT_RDZV_ROUND`)."""
        return self.settings.substitute

    def get_run_id(self) -> str:
        return self.settings.run_id

    def is_closed(self) -> bool:
        if not self.link.key.enabled:
            return bool(self.link.call("check", [self.keys.closed]))
        return self.link.read(self.keys.closed) is not None  # a forged mark closes nothing

    def set_closed(self) -> None:
        self.link.write(self.keys.closed, "1")

    def shutdown(self) -> bool:
        """Close the rendezvous (the job is over: spares exit 0) and stop beating."""
        try:
            self.set_closed()
            self.depart()
        except (RendezvousConnectionError, RuntimeError) as exc:
            log.warning("kit-launch: could not close the rendezvous: %s", exc)
            return False
        return True

    def num_nodes_waiting(self) -> int:
        """Nodes that joined the next round (a spare in the pool does not count: it waits to be invited)."""
        at, value = self._waiting_cache
        now = time.monotonic()
        if now - at < WAITING_CACHE_S:
            return value
        value = self.link.counter(self.keys.round(self.round + 1, "count")) if self.round else 0
        if value and self.link.key.enabled:  # only joiners whose records carry the run's token count
            value = self._sealed_joiners(self.round + 1, value)
        self._waiting_cache = (now, value)
        return value

    def next_rendezvous(self) -> RendezvousInfo:
        called = time.time()
        deadline = time.monotonic() + self.settings.join_timeout_s
        invited_to: int | None = None
        os.environ.pop(env.REJOIN, None)  # set below only for the workers of a substitute's first start
        while True:
            self._raise_if_closed()
            try:
                if self.settings.substitute:  # the round may hold a substitute since it formed: lead with it
                    self.membership.refresh()
                last = self.membership.last_round()
                members = self.membership.members_of(last) if last else {}
                if invited_to is None and self.membership.is_outsider(last, members):
                    if self.settings.substitute:
                        info = substitution.take_place(self, last, members)
                        if info is not None:
                            return self._joined(info, called)
                        wait_s = substitution.look_every_s(len(members))
                        invited_to = self.pool.wait_for_invite(last, wait_s=wait_s)
                    else:
                        invited_to = self.pool.wait_for_invite(last)
                    continue
                t = invited_to if invited_to is not None else last + 1
                invited_to = None
                info = self.enter(t, self.joiner.join(t, deadline))
            except StoreReset:
                continue
            if info is not None:
                return self._joined(info, called)
            if time.monotonic() > deadline and not self.pool.in_pool:
                raise RendezvousTimeoutError(
                    f"the rendezvous did not complete within join_timeout={self.settings.join_timeout_s:g} s"
                )

    def _joined(self, info: RendezvousInfo, called: float) -> RendezvousInfo:
        """This node is in a complete round: tell the launcher (`on_round`), hand torch its info."""
        joined = Joined(self.round, info.rank, info.world_size, called, time.time(), self.beats.gap_max_s)
        self.beats.gap_max_s = 0.0
        for callback in self.on_round:
            callback(joined)
        return info

    # --- the kit's additions ----------------------------------------------------------------------------

    def depart(self) -> None:
        """This node departs for good (drained, given up): the next round does not wait for its expiry."""
        self.beats.depart()

    def record_outcome(self, ended: outcome.RunOutcome) -> outcome.RunOutcome | None:
        """Record why the run ends, before closing (outcome.py); the record that stands."""
        try:
            return outcome.record(self.link, self.settings.run_id, ended)
        except (RendezvousConnectionError, RuntimeError) as exc:
            log.warning("kit-launch: could not record the run's outcome in the rendezvous store: %s", exc)
            return None

    def recorded_outcome(self) -> outcome.RunOutcome | None:
        """Why the rendezvous was closed, as its closer recorded it; None when unknown."""
        try:
            return outcome.read(self.link, self.settings.run_id)
        except (RendezvousConnectionError, RuntimeError) as exc:
            log.warning("kit-launch: could not read the run's outcome from the rendezvous store: %s", exc)
            return None

    def gone_neighbour(self, count: int = RING_NEIGHBOURS) -> tuple[str, str] | None:
        """(name, why) of a node among the next `count` of the last round after this one whose beat says it
        is gone (the round leader's rule), else None. O(count) reads: the agent asks only while a local
        rank is silent (a peer that hangs a collective may be a host that went silent)."""
        self.membership.refresh()  # a substitute may have taken a lost node's place since the round formed
        nodes = ring_after(self.members, self.node, count)
        return self.detector.first_gone(nodes) if nodes else None

    def first_round_complete(self) -> bool:
        return self.membership.last_round() > 0 or self.is_closed()

    # --- internals ----------------------------------------------------------------------------------------

    def _republish(self) -> None:
        """After the store restarted: this node's beat, pool entry and, as a member, the last round."""
        self.beats.beat()
        self.pool.republish()
        self.membership.republish()

    def _sealed_joiners(self, t: int, count: int) -> int:
        """How many of round t's first `count` join records are the run's (a counter anyone can bump must
        not make the agents restart their workers): O(count) reads, only while nodes wait."""
        keys = [self.keys.round(t, f"j{i}") for i in range(1, min(count, MAX_JOINERS_READ) + 1)]
        return sum(1 for raw in self.link.read_many(keys) if raw is not None)

    def _raise_if_closed(self) -> None:
        if self.beats.departed:
            raise RendezvousClosedError("this node left the rendezvous")
        if self.is_closed():
            if self.round == 0 and (self.pool.in_pool or self.settings.spare):
                raise RendezvousGracefulExitError("the job finished before this node was needed")
            raise RendezvousClosedError("the rendezvous is closed (the job finished or was stopped)")

    def enter(self, t: int, result: dict[str, Any]) -> RendezvousInfo | None:
        """This node's info in round t, or None (the round formed without it)."""
        ranks: dict[str, int] = result["ranks"]
        if self.node not in ranks:
            if self.round == t - 1 and self.node in self.members:
                log.warning("kit-launch: round %d formed without this node (late): waiting as a spare", t)
            return None
        rank, world = ranks[self.node], len(ranks)
        rank0 = next(node for node, r in ranks.items() if r == 0)
        addr, port = result["addrs"][rank0].rsplit(" ", 1)  # rank 0's endpoint, named when it joined
        self.membership.took_part(t, result)
        self.pool.forget()  # a member now: a later pool entry is a new one
        self._waiting_cache = (0.0, 0)
        store = dist.PrefixStore(self.keys.round(t, "agent"), self.link.store)
        if self.settings.substitute:  # the workers' keys in the rendezvous store, scoped by this round
            os.environ[env.RDZV_ROUND] = str(t)
            addr, port = self.link.host, str(self.link.port)
        return RendezvousInfo(store, rank, world, RendezvousStoreInfo(addr, int(port)))


def kit_handler(
    params: RendezvousParameters, *, keep_alive_s: float, attempts: int, spare: bool, substitute: bool = False
) -> KitRendezvous:
    """The handler for the launcher's flags (--rdzv-endpoint, --rdzv-conf is_host=1,join_timeout=S)."""
    host, _, port = params.endpoint.rpartition(":")
    is_host = params.get_as_bool("is_host")
    if is_host is None:  # torchrun's rule: the node whose address the endpoint names hosts the store
        is_host = names_this_machine(host)
    link = StoreLink(host or "localhost", int(port or 0), is_host=is_host, key=run_key())
    settings = Settings(
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        beat_s=keep_alive_s,
        attempts=attempts,
        join_timeout_s=float(params.get_as_int("join_timeout", 600)),  # checked by training/launcher/cli.py
        last_call_s=float(params.get_as_int("last_call_timeout", 30)),
        spare=spare,
        substitute=substitute,
    )
    return KitRendezvous(link, settings, local_addr=params.local_addr)


def create_kit_handler(params: RendezvousParameters) -> KitRendezvous:
    """torch's registry creator for "kit": the config also carries the keep-alive (keep_alive_interval in
    seconds, fractions allowed; keep_alive_max_attempt) and `spare` (a hot spare by index)."""
    return kit_handler(
        params,
        keep_alive_s=float(params.get("keep_alive_interval", Settings.beat_s)),
        attempts=int(params.get("keep_alive_max_attempt", Settings.attempts)),
        spare=bool(params.get_as_bool("spare", False)),
        substitute=os.environ.get(env.RANK_RESTART) == "in-place",
    )
