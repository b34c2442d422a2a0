"""The kit's rendezvous (`--rdzv-backend=kit`): liveness in O(1) bytes a beat, membership changes O(N).

torchelastic's c10d rendezvous keeps one shared state (a pickle of every node) and every node's keep-alive is
a compare-and-set of all of it: the store's traffic grows as N^1.6 (bench.scale: ~1 GB/s projected at 1,088
nodes, half of the writes failing and retried). This handler keeps torch's public `RendezvousHandler`
contract, torchrun's flags and the kit's hot-spare, drain and give-up behaviour, on a design where nothing
steady costs more than O(1) per node (NVRx's barrier rendezvous takes the same turn):

- **Liveness**: a node's beat thread sets its own key, `beat/<node>` = its wall clock (a few bytes), every
  keep-alive interval. Nobody reads the beats while the job trains: a lost node is found by its peers'
  workers (a failed collective, or a hang the heartbeat monitor sees), whose agents then re-join. The beats
  are read only while a round forms, and only for the members that did not come back: dead once the beat
  is older than the node's own limit, or at once when it reads `left` (a drained or given-up node,
  `leave()`). The limit adapts to the host, as an accrual failure detector does (Hayashibara et al.; Akka,
  Cassandra): each beat carries the longest gap the node saw between its own beats over the last 30 s,
  and the limit is 3x the larger of that and the load now (the leader's own beat gaps of the last 5 s and
  the joiners' median stall: a burst every node feels, like all of them restarting workers on shared
  cores), at least 3 beats and at most the expiry (interval x attempts). A quiet host (gaps ~0.1 s at the
  default 0.1 s interval) is judged gone 0.3-0.4 s after its last beat; a host whose beats stalled keeps
  the expiry's margin (1.2 s). The nodes' clocks must agree to well under the limit (chrony and Amazon
  Time Sync on EKS: under a millisecond).
- **Membership check** (`num_nodes_waiting`, the agent's every monitor interval): one counter, the number
  of nodes that joined the next round. O(1), cached for a beat.
- **A round** `t`: each joiner takes an index (`add`) and writes its name and the endpoint its workers' store
  would take as rank 0 (its address, a free port); the first becomes the round's
  leader (`compare_set`), polls the joiner count (O(1)), reads the new names (each once) and the beats of
  the absent members, and publishes the result (node -> rank, the endpoints: rank 0's is the workers'
  store, so no node waits for another after the result) once the round is full: the last round's
  members first (a live member, restarting its workers, is waited for: a rank fault re-forms on the same
  nodes), then nodes that joined on their own (the first round, a grow with --nnodes MIN:MAX), then
  invited spares, only for places of members that are gone. Followers poll the result key (O(1)) and watch
  the leader's beat: a dead leader is replaced (`compare_set`) by the first follower that sees it.
  Ranks are kept across rounds (`spares.stable_ranks`: a rank's memory-tier checkpoint stays on its node).
- **Spares and outsiders**: a node that is not in the last complete round, when that round is full (a hot
  spare, a replacement pod, a member dropped as dead that was only late), registers in the pool once and
  polls its own invite key (O(1)); the leader invites as many live pool nodes as places are free, and
  another one when an invited node does not join within the invite timeout.
- **The store may restart** (its pod rescheduled): every call goes through `StoreLink`, which reconnects
  to the new store and has this node publish again what it knows: its beat, its pool entry, and, as a
  member, the last round's number and result (every member writes the same bytes, so the order does not
  matter). Training goes on: the workers' own store lives in their rank 0, not here. A round being formed
  when the store restarts is formed again from scratch.

Store traffic, N nodes, beat interval b: N/b small writes a second in steady training plus N/b counter
reads (the membership checks); a membership change costs each node O(1) polls a second and the leader O(N)
reads once, plus one result (O(N) bytes) read by each node.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
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

from training.contracts.ports import free_port_run
from training.launcher.spares import stable_ranks

log = logging.getLogger("kit.launch")

BACKEND = "kit"
POLL_S = 0.05
"""Seconds between the round leader's polls of the joiner count."""
FOLLOWER_POLL_S = 0.05
"""Seconds between a joiner's checks of its round's result (one small round trip)."""
WAITING_CACHE_S = 0.25
"""How long the membership check's answer is reused (the agent asks every monitor interval), and how often
at most a follower looks at its round leader's beat."""
STALL_WINDOW_S = 30.0
"""How far back a node remembers its own longest gap between two beats (its stall, sent with each beat)."""
STALL_HISTORY_BEATS = 10
"""Beats a node must have behind it before its stall counts: a node with less history is judged at the
expiry."""
LOAD_WINDOW_S = 5.0
"""How far back the leader's own beat gaps count as the load now (a burst: every node restarting workers)."""
VERDICT_STALLS = 3.0
VERDICT_BEATS = 3
"""A silent node is gone once its last beat is older than VERDICT_STALLS x the larger of its own recent stall
and the load now (the leader's own beat gaps of the last LOAD_WINDOW_S, the joiners' median stall), and at
least VERDICT_BEATS beats, never later than the expiry (Settings.verdict_s)."""
RING_NEIGHBOURS = 3
"""How many of the last round's nodes after this one (by rank, around the ring) `gone_neighbour` reads: a lost
node is read by as many of its predecessors, O(1) each."""
SPARE_POLL_S = 0.1
"""Seconds between a waiting spare's checks of its invite key: in steady training, S spares cost the store
S / SPARE_POLL_S small round trips a second (64 spares: 640), and an invite waits at most this long."""
WAIT_S = 0.5
"""A spare's wait for its invite between its looks at the job's end."""
LEFT = "left"
"""A beat's value once its node left for good (drained, given up, finished)."""
STORE_TIMEOUT_S = 60.0
RECONNECT_S = 120.0
"""How long a node tries to reach the store again after losing it (its pod is rescheduled: seconds)."""


@dataclass(frozen=True)
class Settings:
    """What the handler needs from the launcher's flags (validated there, training/launcher/cli.py)."""

    run_id: str
    min_nodes: int
    max_nodes: int
    beat_s: float = 0.1
    attempts: int = 12
    join_timeout_s: float = 600.0
    last_call_s: float = 30.0
    spare: bool = False
    """A hot spare by index (--node-rank >= NNODES): it waits for the first round, then in the pool."""

    @property
    def expiry_s(self) -> float:
        return self.beat_s * self.attempts

    def verdict_s(self, stall_s: float) -> float:
        """How old a silent node's last beat may be before it is gone: VERDICT_STALLS x the longest gap it
        saw between its own beats lately (a quiet host: ~0.1 s -> 0.36 s; one whose beats stall under load
        waits longer), at least VERDICT_BEATS beats, at most the expiry (interval x attempts)."""
        return min(self.expiry_s, max(VERDICT_BEATS * self.beat_s, VERDICT_STALLS * stall_s))

    @property
    def invite_timeout_s(self) -> float:
        """An invited node that has not joined after this long is passed over for another."""
        return max(2.0 * self.expiry_s, 2.0)


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


class Keys:
    """The store's keys of one run (one prefix: runs sharing a store never meet)."""

    def __init__(self, run_id: str) -> None:
        self.prefix = f"kit-rdzv/{run_id}/"

    def __getattr__(self, name: str) -> str:  # closed, last, pool_count
        return self.prefix + name

    def beat(self, node: str) -> str:
        return f"{self.prefix}beat/{node}"

    def invite(self, node: str) -> str:
        return f"{self.prefix}invite/{node}"

    def pool(self, index: int) -> str:
        return f"{self.prefix}pool/{index}"

    def round(self, t: int, name: str) -> str:
        return f"{self.prefix}r{t}/{name}"


def _values(args: tuple[Any, ...]) -> list[Any]:
    return [a() if callable(a) else a for a in args]


class StoreReset(Exception):
    """The store was lost and reached again while a round formed: it must be formed again."""


class StoreLink:
    """The node's TCPStore client, reconnecting when the store restarts (one lock: the beat thread and the
    agent's thread share it; TCPStore serialises calls on one client itself)."""

    def __init__(self, host: str, port: int, *, is_host: bool, timeout_s: float = STORE_TIMEOUT_S) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._lock = threading.Lock()
        self.generation = 0
        """How many times the store was reached again."""
        self.on_reconnect: list[Any] = []
        self.closed = False
        """Set when the node is done with the store: a lost store is then not reached again."""
        self.store = dist.TCPStore(
            host, port, is_master=is_host, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        if is_host:
            self.port = self.store.port  # port 0: the one the server took

    def call(self, method: str, *args: Any) -> Any:
        """The store call; after a lost store, once more on the store reached again (`generation` + 1).
        An argument that is a callable is evaluated at each try (a beat's clock: a retried beat must not
        write the time of the try that failed, older than the store's loss)."""
        generation = self.generation
        try:
            return getattr(self.store, method)(*_values(args))
        except dist.DistNetworkError as exc:
            self._reconnect(generation, exc)
        return getattr(self.store, method)(*_values(args))

    def _reconnect(self, generation: int, exc: BaseException) -> None:
        with self._lock:
            if self.generation != generation:
                return  # another thread reached the store again already
            if self.closed:
                raise RendezvousConnectionError("the rendezvous store is gone and this node is done with it")
            log.warning(
                "kit-launch: lost the rendezvous store (%s); reconnecting", " ".join(str(exc).split())
            )
            deadline = time.monotonic() + RECONNECT_S
            while True:
                try:
                    store = dist.TCPStore(
                        self.host,
                        self.port,
                        is_master=False,
                        wait_for_workers=False,
                        timeout=timedelta(seconds=min(5.0, self.timeout_s)),
                    )
                    break
                except (RuntimeError, dist.DistError) as again:
                    if time.monotonic() > deadline:
                        raise RendezvousConnectionError(
                            f"the rendezvous store {self.host}:{self.port} is gone for "
                            f"{RECONNECT_S:g} s: {again}"
                        ) from again
                    time.sleep(0.2)
            store.set_timeout(timedelta(seconds=self.timeout_s))
            self.store = store
            self.generation += 1
            log.warning("kit-launch: reached the rendezvous store again; publishing this node's state")
        for hook in self.on_reconnect:
            hook()

    def wait_for(self, key: str, timeout_s: float, poll_s: float) -> bool:
        """Whether `key` exists within `timeout_s`, one `check` (a round trip, a few bytes) every `poll_s`.
        Not TCPStore's blocking wait: torch logs two warning lines at each of its timeouts."""
        deadline = time.monotonic() + timeout_s
        while not self.call("check", [key]):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def read(self, key: str) -> str | None:
        """The key's value, or None (never blocks: TCPStore's get waits for a missing key)."""
        if not self.call("check", [key]):
            return None
        return bytes(self.call("get", key)).decode()

    def read_many(self, keys: list[str]) -> list[str | None]:
        if not keys:
            return []
        if self.call("check", keys):
            return [bytes(v).decode() for v in self.call("multi_get", keys)]
        return [self.read(key) for key in keys]

    def counter(self, key: str) -> int:
        return int(self.call("add", key, 0))


@dataclass
class _Formation:
    """The leader's view of round `t` while it forms."""

    t: int
    previous: dict[str, int]
    joined: dict[str, str] = field(default_factory=dict)
    """Joiner -> "ADDR PORT", its address and a free port for the workers' store, in arrival order."""
    joined_at: dict[str, float] = field(default_factory=dict)
    """When the leader read each joiner's name: a node that joined within the expiry is alive by that."""
    read_upto: int = 0
    dead: set[str] = field(default_factory=set)
    missing_since: dict[str, float] = field(default_factory=dict)
    invited: dict[str, float] = field(default_factory=dict)
    passed_over: set[str] = field(default_factory=set)
    suspects: set[str] = field(default_factory=set)
    """Joiners seen gone before (a lost leader): their beat is read even right after they joined."""
    dropped: set[str] = field(default_factory=set)
    """Joiners that are gone (their beat expired or says `left`): not chosen unless they beat again."""
    pool_seen: int = 0
    pool: list[str] = field(default_factory=list)
    min_reached_at: float | None = None
    beats_read_at: float = float("-inf")
    alive_read_at: float = float("-inf")


def _names_this_machine(host: str) -> bool:
    """Whether `host` resolves to an address of this machine (a loopback, or its hostname's)."""
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None)}
        ours = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return any(addr.startswith("127.") or addr == "::1" or addr in ours for addr in theirs)


def beat_value(at: float, stall_s: float) -> str:
    """A beat: the node's wall clock and its own recent stall (seconds)."""
    return f"{at:.3f} {stall_s:.3f}"


def parse_beat(beat: str) -> tuple[float, float]:
    """(when, stall) of a beat; a beat without a stall (none yet) has an infinite one: the expiry rules."""
    at, _, stall = beat.partition(" ")
    return float(at), float(stall) if stall else float("inf")


def _why_dead(beat: str | None, settings: Settings, load: float) -> str:
    if beat == LEFT:
        return "it left"
    if beat is None:
        return "no beat since the store restarted"
    at, stall = parse_beat(beat)
    limit = settings.verdict_s(max(stall, load))
    return (
        f"its last beat was {time.time() - at:.2f} s ago; its limit {limit:.2f} s ({VERDICT_STALLS:g}x the "
        f"larger of its longest recent beat gap, {stall:.2f} s, and the load now, {load:.2f} s; at most "
        f"the expiry {settings.expiry_s:g} s)"
    )


def _median_stall(beats: list[str | None]) -> float:
    """The median of the stalls these beats carry (0 if none has one): a burst every node feels."""
    stalls = sorted(
        stall for b in beats if b is not None and b != LEFT and (stall := parse_beat(b)[1]) != float("inf")
    )
    return stalls[len(stalls) // 2] if stalls else 0.0


def node_id(addr: str) -> str:
    """A name unique to this launcher process: a restarted pod is a new node."""
    return f"{addr}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class KitRendezvous(RendezvousHandler):
    """See the module docstring."""

    def __init__(self, link: StoreLink, settings: Settings, *, local_addr: str | None = None) -> None:
        self.link = link
        self.settings = settings
        self.keys = Keys(settings.run_id)
        self.addr = local_addr or socket.getfqdn()
        self.node = node_id(self.addr)
        self.round = 0
        """The last round this node was part of (0: none yet)."""
        self.members: dict[str, int] = {}
        self._member_addrs: dict[str, str] = {}
        self._pool_index: int | None = None
        self._waiting_cache: tuple[float, int] = (0.0, 0)
        self._stop = threading.Event()
        self._left = False
        self._beat_thread: threading.Thread | None = None
        self.beat_gap_max_s = 0.0
        """The longest time between two of this node's beats since its last round: how close a live node
        came to being judged gone (the expiry's margin on this host); reset at each round."""
        self._gaps: collections.deque[tuple[float, float]] = collections.deque()
        """(when, gap) of this node's recent beats, for the stall it publishes; the beat thread appends,
        the agent's thread reads: under `_gaps_lock`."""
        self._gaps_lock = threading.Lock()
        self._beats = 0
        self._beat_at = time.monotonic()
        """When this node last beat (the beat thread's clock)."""
        self.on_round: list[Any] = []
        """Called with a `Joined` each time this node is in a complete round (the launcher's event)."""
        link.on_reconnect.append(self._republish)
        self._beat()
        self._start_beat()

    # --- RendezvousHandler ------------------------------------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return False

    def get_run_id(self) -> str:
        return self.settings.run_id

    def is_closed(self) -> bool:
        return bool(self.link.call("check", [self.keys.closed]))

    def set_closed(self) -> None:
        self.link.call("set", self.keys.closed, "1")

    def shutdown(self) -> bool:
        """Close the rendezvous (the job is over: spares exit 0) and stop beating."""
        try:
            self.set_closed()
            self.leave()
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
        self._waiting_cache = (now, value)
        return value

    def next_rendezvous(self) -> RendezvousInfo:
        called = time.time()
        deadline = time.monotonic() + self.settings.join_timeout_s
        invited_to: int | None = None
        while True:
            self._raise_if_closed()
            try:
                last = self._last_round()
                members = self._members_of(last) if last else {}
                if invited_to is None and self._is_outsider(last, members):
                    invited_to = self._wait_for_invite(last)
                    continue
                t = invited_to if invited_to is not None else last + 1
                invited_to = None
                info = self._join(t, deadline)
            except StoreReset:
                continue
            if info is not None:
                joined = Joined(
                    self.round, info.rank, info.world_size, called, time.time(), self.beat_gap_max_s
                )
                self.beat_gap_max_s = 0.0
                for callback in self.on_round:
                    callback(joined)
                return info
            if time.monotonic() > deadline and not self._in_pool():
                raise RendezvousTimeoutError(
                    f"the rendezvous did not complete within join_timeout={self.settings.join_timeout_s:g} s"
                )

    # --- the kit's additions ----------------------------------------------------------------------------

    def leave(self) -> None:
        """This node leaves for good (drained, given up): the next round does not wait for its expiry."""
        self._left = True
        self._stop.set()
        with contextlib.suppress(RendezvousConnectionError, RuntimeError):
            self.link.call("set", self.keys.beat(self.node), LEFT)  # else the beat expires

    def gone_neighbour(self, count: int = RING_NEIGHBOURS) -> tuple[str, str] | None:
        """(name, why) of a node among the next `count` of the last round after this one whose beat says it
        is gone (the round leader's rule), else None. O(count) reads: the agent asks only while a local
        rank is silent (a peer that hangs a collective may be a host that went silent)."""
        if self.node not in self.members:
            return None
        by_rank = {rank: node for node, rank in self.members.items()}
        mine, world = self.members[self.node], len(self.members)
        nodes = [by_rank[(mine + i) % world] for i in range(1, min(count, world - 1) + 1)]
        if not nodes:
            return None
        beats = self.link.read_many([self.keys.beat(n) for n in nodes])
        load, now = self._load([]), time.monotonic()
        for node, beat in zip(nodes, beats, strict=True):
            if beat is not None and self._beat_dead(node, beat, now, {}, load):
                return node, _why_dead(beat, self.settings, load)
        return None

    def first_round_complete(self) -> bool:
        return self._last_round() > 0 or self.is_closed()

    # --- internals ----------------------------------------------------------------------------------------

    def _beat(self) -> None:
        if not self._left:
            self.link.call("set", self.keys.beat(self.node), lambda: beat_value(time.time(), self._stall()))

    def _stall(self) -> float:
        """This node's longest gap between two beats over the last STALL_WINDOW_S (inf: too few yet)."""
        if self._beats < STALL_HISTORY_BEATS:
            return float("inf")
        return self._longest_gap(STALL_WINDOW_S, default=self.settings.beat_s)

    def _longest_gap(self, window_s: float, *, default: float) -> float:
        """This node's longest gap between two beats that ended within the last `window_s`."""
        horizon = time.monotonic() - window_s
        with self._gaps_lock:
            return max((gap for at, gap in self._gaps if at >= horizon), default=default)

    def _start_beat(self) -> None:
        def run() -> None:
            last = self._beat_at
            while not self._stop.wait(self.settings.beat_s):
                try:
                    self._beat()
                except (RendezvousConnectionError, RuntimeError) as exc:
                    log.warning("kit-launch: rendezvous beat failed: %s", exc)
                    last = self._beat_at = time.monotonic()  # the store was away, not this node
                    continue
                now = time.monotonic()
                self.beat_gap_max_s = max(self.beat_gap_max_s, now - last)
                with self._gaps_lock:
                    self._gaps.append((now, now - last))
                    while self._gaps[0][0] < now - STALL_WINDOW_S:
                        self._gaps.popleft()
                self._beats += 1
                last = self._beat_at = now

        self._beat_thread = threading.Thread(target=run, name="kit-rdzv-beat", daemon=True)
        self._beat_thread.start()

    def _republish(self) -> None:
        """After the store restarted: this node's beat, pool entry and, as a member, the last round."""
        self._beat()
        if self._pool_index is not None:
            self._pool_index = None
            self._register_in_pool()
        if self.round and self.node in self.members:
            result = self._result_bytes(self.members, self._member_addrs)
            self.link.store.compare_set(self.keys.round(self.round, "result"), "", result)
            self.link.store.compare_set(self.keys.last, "", str(self.round))

    def _raise_if_closed(self) -> None:
        if self._left:
            raise RendezvousClosedError("this node left the rendezvous")
        if self.is_closed():
            if self.round == 0 and (self._pool_index is not None or self.settings.spare):
                raise RendezvousGracefulExitError("the job finished before this node was needed")
            raise RendezvousClosedError("the rendezvous is closed (the job finished or was stopped)")

    def _last_round(self) -> int:
        value = self.link.read(self.keys.last)
        return int(value) if value else 0

    def _members_of(self, t: int) -> dict[str, int]:
        if t == self.round and self.members:
            return dict(self.members)
        raw = self.link.read(self.keys.round(t, "result"))
        return json.loads(raw)["ranks"] if raw else {}

    def _is_outsider(self, last: int, members: dict[str, int]) -> bool:
        """Not in the last complete round while that round is full (or a spare before the first round)."""
        if self.settings.spare and last == 0:
            return True
        return bool(last) and self.node not in members and len(members) >= self.settings.max_nodes

    def _in_pool(self) -> bool:
        return self._pool_index is not None

    def _register_in_pool(self) -> None:
        if self._pool_index is None:
            index = self.link.call("add", self.keys.pool_count, 1)
            self.link.call("set", self.keys.pool(index), self.node)
            self._pool_index = index

    def _wait_for_invite(self, last: int) -> int | None:
        """Wait in the pool (no timeout: a spare waits as long as the job runs) for an invite; the round
        number it names, or None when the last round changed so that this node should look again."""
        if not (self.settings.spare and last == 0):
            self._register_in_pool()
        key = self.keys.invite(self.node)
        checks = 0
        while True:
            if self._pool_index is None and self._last_round() > 0:
                self._register_in_pool()  # a spare by index: the first round is complete
            if self.link.wait_for(key, WAIT_S, SPARE_POLL_S):
                value = self.link.read(key)
                self.link.call("delete_key", key)
                if value:
                    return int(value)
            checks += 1
            if checks % 2 == 0:  # once a second: the job's end, or a round that no longer is full
                self._raise_if_closed()
                if self._pool_index is not None:
                    now_last = self._last_round()
                    if not self._is_outsider(now_last, self._members_of(now_last) if now_last else {}):
                        return None

    def _join(self, t: int, deadline: float) -> RendezvousInfo | None:
        """Join round `t`; its info if this node is in it, None if it completed without this node."""
        generation = self.link.generation
        index = self.link.call("add", self.keys.round(t, "count"), 1)
        endpoint = f"{self.addr} {free_port_run()}"  # the workers' store, should this node be rank 0
        self.link.call("set", self.keys.round(t, f"j{index}"), json.dumps([self.node, endpoint]))
        leader_key = self.keys.round(t, "leader")
        leader = bytes(self.link.call("compare_set", leader_key, "", self.node)).decode()
        formation: _Formation | None = None
        lost_leaders: set[str] = set()
        last_leader_check = time.monotonic()
        result_key = self.keys.round(t, "result")
        while True:
            if leader != self.node:  # a follower: polls the result key until its leader's next check
                self.link.wait_for(result_key, self.settings.beat_s, FOLLOWER_POLL_S)
            raw = self.link.read(result_key)
            if self.link.generation != generation:
                raise StoreReset  # the store restarted: round t's joiners and leader are gone
            if raw is not None:
                return self._finish(t, json.loads(raw))
            now = time.monotonic()
            if leader == self.node:
                if formation is None:
                    formation = _Formation(t=t, previous=self._members_of(t - 1) if t > 1 else {})
                    formation.dropped |= lost_leaders
                    formation.suspects |= lost_leaders
                if self._lead(formation):
                    continue
            elif now - last_leader_check >= max(self.settings.beat_s, WAITING_CACHE_S):
                last_leader_check = now
                if self._is_dead(leader, now, {}):
                    lost_leaders.add(leader)
                    won = bytes(self.link.call("compare_set", leader_key, leader, self.node)).decode()
                    if won == self.node:
                        log.warning("kit-launch: round %d's leader %s is gone; this node leads", t, leader)
                    leader = won
                else:
                    self._raise_if_closed()
            if now > deadline:
                raise RendezvousTimeoutError(
                    f"round {t} did not complete within join_timeout={self.settings.join_timeout_s:g} s"
                )
            if leader == self.node:
                time.sleep(POLL_S)

    def _is_dead(self, node: str, now: float, missing_since: dict[str, float]) -> bool:
        beat = self.link.read(self.keys.beat(node))
        return self._beat_dead(node, beat, now, missing_since, self._load([]))

    def _beat_dead(
        self, node: str, beat: str | None, now: float, missing_since: dict[str, float], load: float
    ) -> bool:
        if beat == LEFT:
            return True
        if beat is None:  # no beat yet (the store restarted and the node has not published again)
            return now - missing_since.setdefault(node, now) > self.settings.expiry_s
        at, stall = parse_beat(beat)
        return time.time() - at > self.settings.verdict_s(max(stall, load))

    def _load(self, others: list[str | None]) -> float:
        """The load now: this node's longest beat gap of the last LOAD_WINDOW_S (the one in progress too)
        and the median stall the other nodes' beats carry. On a real cluster each host has its own cores
        and this stays small; when every node restarts its workers on shared, busy cores, it grows, and a
        late beat then waits longer before its node is judged gone."""
        mine = self._longest_gap(LOAD_WINDOW_S, default=0.0)
        return max(mine, time.monotonic() - self._beat_at, _median_stall(others))

    def _lead(self, f: _Formation) -> bool:
        """One step of forming round f.t; True once the result is published."""
        s = self.settings
        now = time.monotonic()
        count = self.link.counter(self.keys.round(f.t, "count"))
        fresh = range(f.read_upto + 1, count + 1)
        names = self.link.read_many([self.keys.round(f.t, f"j{i}") for i in fresh])
        for index, raw in zip(fresh, names, strict=True):
            if raw is None:  # written right after its index was taken: read it on the next poll, unless
                since = f.missing_since.setdefault(f"j{index}", now)  # its node died in between
                if now - since <= s.expiry_s:
                    break
            else:
                name, addr = json.loads(raw)
                f.joined.setdefault(name, addr)
                f.joined_at.setdefault(name, now)
            f.read_upto += 1
        absent = [m for m in f.previous if m not in f.joined and m not in f.dead]
        if absent and now - f.beats_read_at >= s.beat_s / 2:  # O(N) reads, twice a beat at most
            f.beats_read_at = now
            others = [n for n in f.joined if n != self.node]
            beats = self.link.read_many([self.keys.beat(m) for m in [*absent, *others]])
            load = self._load(beats[len(absent) :])
            for member, beat in zip(absent, beats[: len(absent)], strict=True):
                if self._beat_dead(member, beat, now, f.missing_since, load):
                    f.dead.add(member)
                    log.warning(
                        "kit-launch: round %d: node %s is gone (%s)",
                        f.t,
                        member,
                        _why_dead(beat, self.settings, load),
                    )
        coming = [m for m in absent if m not in f.dead]
        if f.dropped:  # look again (half a beat apart): a dropped joiner that beats again is taken back
            self._all_alive(f, [], now)
        members = [n for n in f.joined if n in f.previous and n not in f.dropped]
        outsiders = [n for n in f.joined if n not in f.previous and n not in f.dropped]
        places = s.max_nodes - len(members) - len(coming)
        chosen = members + outsiders[: max(places, 0)]
        if len(chosen) >= s.max_nodes:
            if self._all_alive(f, chosen[: s.max_nodes], now):
                self._publish(f, chosen[: s.max_nodes])
                return True
            return False
        if coming:
            f.min_reached_at = None
            return False
        wanted = places - len(outsiders) - sum(1 for n in f.invited if n not in f.joined)
        if wanted > 0:
            self._invite(f, wanted, now)
        if len(chosen) >= s.min_nodes and s.min_nodes < s.max_nodes:
            f.min_reached_at = f.min_reached_at or now
            if now - f.min_reached_at >= s.last_call_s and self._all_alive(f, chosen, now):
                self._publish(f, chosen)
                return True
        return False

    def _all_alive(self, f: _Formation, chosen: list[str], now: float) -> bool:
        """Whether every chosen node still beats, once the round is full: the beats of every joiner are
        read (O(N), once a round unless one is gone) and `dropped` becomes the joiners that are gone now (a
        joiner that died while the round formed, or a lost leader; one that beats again is taken back).
        The beats are read at most twice a beat; in between, the last reading answers."""
        if now - f.alive_read_at < self.settings.beat_s / 2:
            return not f.dropped & set(chosen)
        f.alive_read_at = now
        expiry = self.settings.expiry_s  # the leader is alive (it runs this), and so is a recent joiner
        others = [
            n
            for n in f.joined
            if n != self.node and (n in f.suspects or now - f.joined_at.get(n, now) > expiry)
        ]
        beats = dict(zip(others, self.link.read_many([self.keys.beat(n) for n in others]), strict=True))
        load = self._load(list(beats.values()))
        gone = {n for n, beat in beats.items() if self._beat_dead(n, beat, now, {}, load)}
        for node in gone - f.dropped:
            why = _why_dead(beats[node], self.settings, load)
            log.warning("kit-launch: round %d: joined node %s is gone (%s)", f.t, node, why)
        f.dropped = gone
        return not gone & set(chosen)

    def _invite(self, f: _Formation, wanted: int, now: float) -> None:
        for node, at in list(f.invited.items()):
            if node not in f.joined and now - at > self.settings.invite_timeout_s:
                del f.invited[node]
                f.passed_over.add(node)
                log.warning("kit-launch: round %d: invited node %s did not join; passing it over", f.t, node)
        count = self.link.counter(self.keys.pool_count)
        names = self.link.read_many([self.keys.pool(i) for i in range(f.pool_seen + 1, count + 1)])
        for raw in names:
            if raw is None:
                break
            f.pool.append(raw)
            f.pool_seen += 1
        skip = set(f.previous) | set(f.joined) | set(f.invited) | f.passed_over | f.dead | f.dropped
        candidates = [n for n in f.pool if n not in skip]
        beats = self.link.read_many([self.keys.beat(n) for n in candidates])
        for node, beat in zip(candidates, beats, strict=True):
            if wanted <= 0:
                break
            if self._beat_dead(node, beat, now, f.missing_since, self._load([])):
                f.passed_over.add(node)
                continue
            self.link.call("set", self.keys.invite(node), str(f.t))
            f.invited[node] = now
            wanted -= 1
            log.info("kit-launch: round %d: inviting node %s to take a free place", f.t, node)

    def _publish(self, f: _Formation, chosen: list[str]) -> None:
        ranks = stable_ranks(f.previous, sorted(chosen))
        addrs = {n: f.joined[n] for n in chosen}
        self.link.call("set", self.keys.round(f.t, "result"), self._result_bytes(ranks, addrs))
        self.link.call("set", self.keys.last, str(f.t))

    @staticmethod
    def _result_bytes(ranks: dict[str, int], addrs: dict[str, str]) -> str:
        return json.dumps({"ranks": ranks, "addrs": addrs}, sort_keys=True)

    def _finish(self, t: int, result: dict[str, Any]) -> RendezvousInfo | None:
        ranks: dict[str, int] = result["ranks"]
        if self.node not in ranks:
            if self.round == t - 1 and self.node in self.members:
                log.warning("kit-launch: round %d formed without this node (late): waiting as a spare", t)
            return None
        rank, world = ranks[self.node], len(ranks)
        rank0 = next(node for node, r in ranks.items() if r == 0)
        addr, port = result["addrs"][rank0].rsplit(" ", 1)  # rank 0's endpoint, named when it joined
        self.round, self.members, self._member_addrs = t, dict(ranks), dict(result["addrs"])
        self._pool_index = None  # a member now: a later pool entry is a new one
        self._waiting_cache = (0.0, 0)
        store = dist.PrefixStore(self.keys.round(t, "agent"), self.link.store)
        return RendezvousInfo(store, rank, world, RendezvousStoreInfo(addr, int(port)))


def kit_handler(
    params: RendezvousParameters, *, keep_alive_s: float, attempts: int, spare: bool
) -> KitRendezvous:
    """The handler for the launcher's flags (--rdzv-endpoint, --rdzv-conf is_host=1,join_timeout=S)."""
    host, _, port = params.endpoint.rpartition(":")
    is_host = params.get_as_bool("is_host")
    if is_host is None:  # torchrun's rule: the node whose address the endpoint names hosts the store
        is_host = _names_this_machine(host)
    link = StoreLink(host or "localhost", int(port or 0), is_host=is_host)
    settings = Settings(
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        beat_s=keep_alive_s,
        attempts=attempts,
        join_timeout_s=float(params.get_as_int("join_timeout", 600)),  # checked by training/launcher/cli.py
        last_call_s=float(params.get_as_int("last_call_timeout", 30)),
        spare=spare,
    )
    return KitRendezvous(link, settings, local_addr=params.local_addr)
