"""Liveness: each node's beat, O(1) bytes, and the accrual failure detector that judges a silent node by it.

A node's beat thread sets its own key, `beat/<node>` = its wall clock (a few bytes), every keep-alive
interval. Nobody reads the beats while the job trains: a lost node is found by its peers' workers (a failed
collective, or a hang the heartbeat monitor sees), whose agents then re-join. The beats are read only while
a round forms, and only for the members that did not come back: dead once the beat is older than the node's
own limit, or at once when it reads `left` (a drained or given-up node, `depart()`). The limit adapts to the
host, as an accrual failure detector does (Hayashibara et al.; Akka, Cassandra): each beat carries the
longest gap the node saw between its own beats over the last 30 s, and the limit is 3x the larger of that
and the load now (the leader's own beat gaps of the last 5 s and the joiners' median stall: a burst every
node feels, like all of them restarting workers on shared cores), at least 3 beats and at most the expiry
(interval x attempts). A quiet host (gaps ~0.1 s at the default 0.1 s interval) is judged gone 0.3-0.4 s
after its last beat; a host whose beats stalled keeps the expiry's margin (1.2 s). The nodes' clocks must
agree to well under the limit (chrony and Amazon Time Sync on EKS: under a millisecond).

The same rule answers the agent's neighbour check (`FailureDetector.first_gone` over a node's ring
neighbours): while a local rank is silent, a peer that hangs a collective may be a host that went silent.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time

from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from fsdpkit.launcher.rendezvous.settings import VERDICT_STALLS, Settings
from fsdpkit.launcher.rendezvous.store_link import Keys, StoreLink

log = logging.getLogger("kit.launch")

STALL_WINDOW_S = 30.0
"""How far back a node remembers its own longest gap between two beats (its stall, sent with each beat)."""
STALL_HISTORY_BEATS = 10
"""Beats a node must have behind it before its stall counts: a node with less history is judged at the
expiry."""
LOAD_WINDOW_S = 5.0
"""How far back the leader's own beat gaps count as the load now (a burst: every node restarting workers)."""
RING_NEIGHBOURS = 3
"""How many of the last round's nodes after this one (by rank, around the ring) `gone_neighbour` reads: a lost
node is read by as many of its predecessors, O(1) each."""
LEFT = "left"
"""A beat's value once its node left for good (drained, given up, finished)."""


def beat_value(at: float, stall_s: float) -> str:
    """A beat: the node's wall clock and its own recent stall (seconds)."""
    return f"{at:.3f} {stall_s:.3f}"


def parse_beat(beat: str) -> tuple[float, float]:
    """(when, stall) of a beat; a beat without a stall (none yet) has an infinite one: the expiry rules."""
    at, _, stall = beat.partition(" ")
    return float(at), float(stall) if stall else float("inf")


def why_dead(beat: str | None, settings: Settings, load: float) -> str:
    """The verdict's reason, for the log line that names a gone node."""
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


def median_stall(beats: list[str | None]) -> float:
    """The median of the stalls these beats carry (0 if none has one): a burst every node feels."""
    stalls = sorted(
        stall for b in beats if b is not None and b != LEFT and (stall := parse_beat(b)[1]) != float("inf")
    )
    return stalls[len(stalls) // 2] if stalls else 0.0


class Beats:
    """This node's beat: a thread sets `beat/<node>` every interval and keeps the gaps between its beats
    (the stall each beat carries, and this node's share of the load now)."""

    def __init__(self, link: StoreLink, keys: Keys, node: str, settings: Settings) -> None:
        self.link = link
        self.settings = settings
        self._key = keys.beat(node)
        self._stop = threading.Event()
        self.departed = False
        """Set once the node left for good: it beats no more and its key reads `left`."""
        self._thread: threading.Thread | None = None
        self.gap_max_s = 0.0
        """The longest time between two of this node's beats since its last round: how close a live node
        came to being judged gone (the expiry's margin on this host); reset at each round."""
        self._gaps: collections.deque[tuple[float, float]] = collections.deque()
        """(when, gap) of this node's recent beats, for the stall it publishes; the beat thread appends,
        the agent's thread reads: under `_gaps_lock`."""
        self._gaps_lock = threading.Lock()
        self._count = 0
        self.at = time.monotonic()
        """When this node last beat (the beat thread's clock)."""

    def beat(self) -> None:
        if not self.departed:
            self.link.write(self._key, lambda: beat_value(time.time(), self.stall()))

    def depart(self) -> None:
        """Stop beating and say `left`: the next round does not wait for this node's expiry."""
        self.departed = True
        self._stop.set()
        with contextlib.suppress(RendezvousConnectionError, RuntimeError):
            self.link.write(self._key, LEFT)  # else the beat expires

    def stall(self) -> float:
        """This node's longest gap between two beats over the last STALL_WINDOW_S (inf: too few yet)."""
        if self._count < STALL_HISTORY_BEATS:
            return float("inf")
        return self.longest_gap(STALL_WINDOW_S, default=self.settings.beat_s)

    def longest_gap(self, window_s: float, *, default: float) -> float:
        """This node's longest gap between two beats that ended within the last `window_s`."""
        horizon = time.monotonic() - window_s
        with self._gaps_lock:
            return max((gap for at, gap in self._gaps if at >= horizon), default=default)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kit-rdzv-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = self.at
        while not self._stop.wait(self.settings.beat_s):
            try:
                self.beat()
            except (RendezvousConnectionError, RuntimeError) as exc:
                log.warning("kit-launch: rendezvous beat failed: %s", exc)
                last = self.at = time.monotonic()  # the store was away, not this node
                continue
            now = time.monotonic()
            self.gap_max_s = max(self.gap_max_s, now - last)
            with self._gaps_lock:
                self._gaps.append((now, now - last))
                while self._gaps[0][0] < now - STALL_WINDOW_S:
                    self._gaps.popleft()
            self._count += 1
            last = self.at = now


class FailureDetector:
    """Whether a node is gone, from its beat: it reads `left`, or it is older than the node's own limit
    (`Settings.verdict_s` of the larger of its stall and the load now)."""

    def __init__(self, link: StoreLink, keys: Keys, settings: Settings, beats: Beats) -> None:
        self.link = link
        self.keys = keys
        self.settings = settings
        self.beats = beats

    def is_dead(self, node: str, now: float, missing_since: dict[str, float]) -> bool:
        beat = self.link.read(self.keys.beat(node))
        return self.beat_dead(node, beat, now, missing_since, self.load([]))

    def beat_dead(
        self, node: str, beat: str | None, now: float, missing_since: dict[str, float], load: float
    ) -> bool:
        if beat == LEFT:
            return True
        if beat is None:  # no beat yet (the store restarted and the node has not published again)
            return now - missing_since.setdefault(node, now) > self.settings.expiry_s
        at, stall = parse_beat(beat)
        return time.time() - at > self.settings.verdict_s(max(stall, load))

    def load(self, others: list[str | None]) -> float:
        """The load now: this node's longest beat gap of the last LOAD_WINDOW_S (the one in progress too)
        and the median stall the other nodes' beats carry. On a real cluster each host has its own cores
        and this stays small; when every node restarts its workers on shared, busy cores, it grows, and a
        late beat then waits longer before its node is judged gone."""
        mine = self.beats.longest_gap(LOAD_WINDOW_S, default=0.0)
        return max(mine, time.monotonic() - self.beats.at, median_stall(others))

    def why(self, beat: str | None, load: float) -> str:
        return why_dead(beat, self.settings, load)

    def first_gone(self, nodes: list[str]) -> tuple[str, str] | None:
        """(name, why) of the first of `nodes` whose beat says it is gone, else None; O(len(nodes)) reads.
        A node with no beat is skipped: after a store restart it may not have published again yet."""
        beats = self.link.read_many([self.keys.beat(n) for n in nodes])
        load, now = self.load([]), time.monotonic()
        for node, beat in zip(nodes, beats, strict=True):
            if beat is not None and self.beat_dead(node, beat, now, {}, load):
                return node, why_dead(beat, self.settings, load)
        return None
