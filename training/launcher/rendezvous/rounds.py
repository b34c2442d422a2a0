"""Rounds: how the nodes form round `t`, each polling O(1) and the leader reading O(N) once a change.

Each joiner takes an index (`add`) and writes its name and the endpoint its workers' store would take as
rank 0 (its address, a free port); the first becomes the round's leader (`compare_set`), polls the joiner
count (O(1)), reads the new names (each once) and the beats of the absent members, and publishes the result
(node -> rank, the endpoints: rank 0's is the workers' store, so no node waits for another after the
result) once the round is full: the last round's members first (a live member, restarting its workers, is
waited for: a rank fault re-forms on the same nodes), then nodes that joined on their own (the first round,
a grow with --nnodes MIN:MAX), then invited spares, only for places of members that are gone. Followers
poll the result key (O(1)) and watch the leader's beat: a dead leader is replaced (`compare_set`) by the
first follower that sees it. Ranks are kept across rounds (`ranks.stable_ranks`: a rank's memory-tier
checkpoint stays on its node).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

from fsdpkit.contracts.ports import free_port_run
from fsdpkit.launcher.rendezvous.liveness import FailureDetector
from fsdpkit.launcher.rendezvous.ranks import stable_ranks
from fsdpkit.launcher.rendezvous.settings import Settings
from fsdpkit.launcher.rendezvous.store_link import Keys, StoreLink, StoreReset

log = logging.getLogger("kit.launch")

POLL_S = 0.05
"""Seconds between the round leader's polls of the joiner count."""
FOLLOWER_POLL_S = 0.05
"""Seconds between a joiner's checks of its round's result (one small round trip)."""
WAITING_CACHE_S = 0.25
"""How long the membership check's answer is reused (the agent asks every monitor interval), and how often
at most a follower looks at its round leader's beat."""


def result_bytes(ranks: dict[str, int], addrs: dict[str, str]) -> str:
    """A round's published result: node -> rank and node -> "ADDR PORT" (the same bytes on every node)."""
    return json.dumps({"ranks": ranks, "addrs": addrs}, sort_keys=True)


class Membership:
    """This node's view of the rounds: the last it was in (members, endpoints) and the last complete one."""

    def __init__(self, link: StoreLink, keys: Keys, node: str, settings: Settings) -> None:
        self.link = link
        self.keys = keys
        self.node = node
        self.settings = settings
        self.round = 0
        """The last round this node was part of (0: none yet)."""
        self.members: dict[str, int] = {}
        self.addrs: dict[str, str] = {}

    def took_part(self, t: int, result: dict[str, Any]) -> None:
        self.round, self.members, self.addrs = t, dict(result["ranks"]), dict(result["addrs"])

    def refresh(self) -> None:
        """Read this node's round's result again (a substitute may have taken a lost node's place)."""
        if self.round and self.node in self.members:
            raw = self.link.read(self.keys.round(self.round, "result"))
            if raw:
                result = json.loads(raw)
                if self.node in result["ranks"]:
                    self.took_part(self.round, result)

    def last_round(self) -> int:
        value = self.link.read(self.keys.last)
        return int(value) if value else 0

    def members_of(self, t: int) -> dict[str, int]:
        if t == self.round and self.members:
            return dict(self.members)
        raw = self.link.read(self.keys.round(t, "result"))
        return json.loads(raw)["ranks"] if raw else {}

    def is_outsider(self, last: int, members: dict[str, int]) -> bool:
        """Not in the last complete round while that round is full (or a spare before the first round)."""
        if self.settings.spare and last == 0:
            return True
        return bool(last) and self.node not in members and len(members) >= self.settings.max_nodes

    def republish(self) -> None:
        """After the store restarted: as a member, the last round's number and result (first writer wins)."""
        if self.round and self.node in self.members:
            result = result_bytes(self.members, self.addrs)
            self.link.claim(self.keys.round(self.round, "result"), None, result)
            self.link.claim(self.keys.last, None, str(self.round))


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


class RoundLeader:
    """Forms a round as its leader: reads the joiners, judges the members that did not come back, invites
    spares to the places of the gone, and publishes the result once the round is full."""

    def __init__(
        self, link: StoreLink, keys: Keys, node: str, settings: Settings, detector: FailureDetector
    ) -> None:
        self.link = link
        self.keys = keys
        self.node = node
        self.settings = settings
        self.detector = detector

    def step(self, f: _Formation) -> bool:
        """One step of forming round f.t; True once the result is published."""
        s = self.settings
        now = time.monotonic()
        self._read_joiners(f, now)
        absent = [m for m in f.previous if m not in f.joined and m not in f.dead]
        if absent and now - f.beats_read_at >= s.beat_s / 2:  # O(N) reads, twice a beat at most
            self._judge_absent(f, absent, now)
        coming = [m for m in absent if m not in f.dead]
        if f.dropped:  # look again (half a beat apart): a dropped joiner that beats again is taken back
            self.all_alive(f, [], now)
        members = [n for n in f.joined if n in f.previous and n not in f.dropped]
        outsiders = [n for n in f.joined if n not in f.previous and n not in f.dropped]
        places = s.max_nodes - len(members) - len(coming)
        chosen = members + outsiders[: max(places, 0)]
        if len(chosen) >= s.max_nodes:
            if self.all_alive(f, chosen[: s.max_nodes], now):
                self.publish(f, chosen[: s.max_nodes])
                return True
            return False
        if coming:
            f.min_reached_at = None
            return False
        wanted = places - len(outsiders) - sum(1 for n in f.invited if n not in f.joined)
        if wanted > 0:
            self.invite(f, wanted, now)
        if len(chosen) >= s.min_nodes and s.min_nodes < s.max_nodes:
            f.min_reached_at = f.min_reached_at or now
            if now - f.min_reached_at >= s.last_call_s and self.all_alive(f, chosen, now):
                self.publish(f, chosen)
                return True
        return False

    def _read_joiners(self, f: _Formation, now: float) -> None:
        """The names of the nodes that joined since the last poll, each read once, in arrival order."""
        count = self.link.counter(self.keys.round(f.t, "count"))
        fresh = range(f.read_upto + 1, count + 1)
        names = self.link.read_many([self.keys.round(f.t, f"j{i}") for i in fresh])
        for index, raw in zip(fresh, names, strict=True):
            if raw is None:  # written right after its index was taken: read it on the next poll, unless
                since = f.missing_since.setdefault(f"j{index}", now)  # its node died in between, or the
                if now - since <= self.settings.expiry_s and not self._forged(f.t, f"j{index}"):
                    break  # record there is not the run's (skipped at once)
            else:
                name, addr = json.loads(raw)
                f.joined.setdefault(name, addr)
                f.joined_at.setdefault(name, now)
            f.read_upto += 1

    def _judge_absent(self, f: _Formation, absent: list[str], now: float) -> None:
        """Mark dead the last round's members that did not come back and whose beats say so (the joiners'
        beats weigh in as the load now)."""
        f.beats_read_at = now
        others = [n for n in f.joined if n != self.node]
        beats = self.link.read_many([self.keys.beat(m) for m in [*absent, *others]])
        load = self.detector.load(beats[len(absent) :])
        for member, beat in zip(absent, beats[: len(absent)], strict=True):
            if self.detector.beat_dead(member, beat, now, f.missing_since, load):
                f.dead.add(member)
                log.warning(
                    "kit-launch: round %d: node %s is gone (%s)", f.t, member, self.detector.why(beat, load)
                )

    def all_alive(self, f: _Formation, chosen: list[str], now: float) -> bool:
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
        load = self.detector.load(list(beats.values()))
        gone = {n for n, beat in beats.items() if self.detector.beat_dead(n, beat, now, {}, load)}
        for node in gone - f.dropped:
            why = self.detector.why(beats[node], load)
            log.warning("kit-launch: round %d: joined node %s is gone (%s)", f.t, node, why)
        f.dropped = gone
        return not gone & set(chosen)

    def invite(self, f: _Formation, wanted: int, now: float) -> None:
        """Invite up to `wanted` live pool nodes; an invited node that did not join in time is passed over."""
        for node, at in list(f.invited.items()):
            if node not in f.joined and now - at > self.settings.invite_timeout_s:
                del f.invited[node]
                f.passed_over.add(node)
                log.warning("kit-launch: round %d: invited node %s did not join; passing it over", f.t, node)
        count = self.link.counter(self.keys.pool_count)
        fresh = range(f.pool_seen + 1, count + 1)
        names = self.link.read_many([self.keys.pool(i) for i in fresh])
        for index, raw in zip(fresh, names, strict=True):
            if raw is None:  # not written yet (skipped once its writer had time), or not the run's
                since = f.missing_since.setdefault(f"p{index}", now)
                if now - since <= self.settings.expiry_s and not self._forged(None, self.keys.pool(index)):
                    break
            else:
                f.pool.append(raw)
            f.pool_seen += 1
        skip = set(f.previous) | set(f.joined) | set(f.invited) | f.passed_over | f.dead | f.dropped
        candidates = [n for n in f.pool if n not in skip]
        beats = self.link.read_many([self.keys.beat(n) for n in candidates])
        for node, beat in zip(candidates, beats, strict=True):
            if wanted <= 0:
                break
            if self.detector.beat_dead(node, beat, now, f.missing_since, self.detector.load([])):
                f.passed_over.add(node)
                continue
            self.link.write(self.keys.invite(node), str(f.t))
            f.invited[node] = now
            wanted -= 1
            log.info("kit-launch: round %d: inviting node %s to take a free place", f.t, node)

    def _forged(self, t: int | None, name: str) -> bool:
        """Whether the key (round t's `name`, or `name` itself), which read as no record, holds one that is
        not the run's: skipped at once, not waited for."""
        key = self.keys.round(t, name) if t is not None else name
        return self.link.key.enabled and self.link.raw(key) is not None

    def publish(self, f: _Formation, chosen: list[str]) -> None:
        ranks = stable_ranks(f.previous, sorted(chosen))
        addrs = {n: f.joined[n] for n in chosen}
        self.link.write(self.keys.round(f.t, "result"), result_bytes(ranks, addrs))
        self.link.write(self.keys.last, str(f.t))


class Joiner:
    """This node's part in round `t`: it takes an index and writes its name and endpoint, then leads the
    round or follows its leader (taking the lead from a leader that is gone) until the result is out."""

    def __init__(
        self,
        link: StoreLink,
        keys: Keys,
        node: str,
        addr: str,
        *,
        settings: Settings,
        detector: FailureDetector,
        membership: Membership,
        check_open: Callable[[], None],
    ) -> None:
        self.link = link
        self.keys = keys
        self.node = node
        self.addr = addr
        self.settings = settings
        self.detector = detector
        self.membership = membership
        self.check_open = check_open
        """Raises if the rendezvous is closed or this node left (a follower asks while it waits)."""
        self.leader = RoundLeader(link, keys, node, settings, detector)

    def join(self, t: int, deadline: float) -> dict[str, Any]:
        """Round t's published result ({"ranks", "addrs"}); StoreReset if the store restarted meanwhile."""
        generation = self.link.generation
        index = self.link.call("add", self.keys.round(t, "count"), 1)
        endpoint = f"{self.addr} {free_port_run()}"  # the workers' store, should this node be rank 0
        self.link.write(self.keys.round(t, f"j{index}"), json.dumps([self.node, endpoint]))
        leader_key = self.keys.round(t, "leader")
        leader = self.link.claim(leader_key, None, self.node)
        formation: _Formation | None = None
        lost_leaders: set[str] = set()
        last_leader_check = time.monotonic()
        result_key = self.keys.round(t, "result")
        while True:
            present = False
            if leader != self.node:  # a follower: polls the result key until its leader's next check
                present = self.link.wait_for(result_key, self.settings.beat_s, FOLLOWER_POLL_S)
            raw = self.link.read(result_key)
            if self.link.generation != generation:
                raise StoreReset  # the store restarted: round t's joiners and leader are gone
            if raw is not None:
                return json.loads(raw)
            if present:  # a result that is not the run's (forged): poll on, do not spin
                time.sleep(FOLLOWER_POLL_S)
            now = time.monotonic()
            if leader == self.node:
                if formation is None:
                    formation = _Formation(t=t, previous=self.membership.members_of(t - 1) if t > 1 else {})
                    formation.dropped |= lost_leaders
                    formation.suspects |= lost_leaders
                if self.leader.step(formation):
                    continue
            elif now - last_leader_check >= max(self.settings.beat_s, WAITING_CACHE_S):
                last_leader_check = now
                if self.detector.is_dead(leader, now, {}):
                    lost_leaders.add(leader)
                    won = self.link.claim(leader_key, leader, self.node)
                    if won == self.node:
                        log.warning("kit-launch: round %d's leader %s is gone; this node leads", t, leader)
                    leader = won
                else:
                    self.check_open()
            if now > deadline:
                raise RendezvousTimeoutError(
                    f"round {t} did not complete within join_timeout={self.settings.join_timeout_s:g} s"
                )
            if leader == self.node:
                time.sleep(POLL_S)
