"""The kit's rendezvous (training/launcher/rendezvous/) against the kit's real store process: rounds, kept
ranks, spares, silent and departed nodes, a flapping node, a lost leader, the store's restart, the job's end.

Members run as handlers on threads of this process (the agent's calls: next_rendezvous, num_nodes_waiting);
a node that must be lost the way a host is lost runs in its own process (tests/training/rdzv_node.py), so
that SIGSTOP silences it with its socket open."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousGracefulExitError

from fsdpkit.contracts.ports import free_port_run
from fsdpkit.launcher.rendezvous import Joined, KitRendezvous, Settings, StoreLink
from fsdpkit.launcher.rendezvous.liveness import LEFT, beat_value, parse_beat
from fsdpkit.runtime.run_token import NO_KEY, RunKey

REPO = Path(__file__).resolve().parents[2]
NODE = Path(__file__).with_name("rdzv_node.py")
pytestmark = pytest.mark.timeout(120)
WAIT_S = 30.0
LAST_CALL_S = 1.0
"""An elastic round (MIN:MAX) forms this long after it has MIN members and nobody else can come."""


class Store:
    """`python -m fsdpkit.launcher.store` on a free port; `restart()` kills it and serves the port again."""

    def __init__(self) -> None:
        self.port = free_port_run(1)
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = self._serve()

    def _serve(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fsdpkit.launcher.store", "--host", "127.0.0.1",
             "--port", str(self.port)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None and "serving" in proc.stdout.readline()
        return proc

    def restart(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = self._serve()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store()
    yield s
    for member in Member.alive:  # their threads end; none reaches for the store once it is gone
        member.handler.link.closed = True
        member.handler.depart()
    Member.alive.clear()
    s.close()


def eventually(check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


class Member:
    """A handler on a thread: `join()` starts next_rendezvous, `result()` waits for its (round, rank)."""

    alive: list[Member] = []

    def __init__(
        self,
        store: Store,
        nodes: int,
        run_id: str = "t",
        *,
        spare: bool = False,
        min_nodes: int = 0,
        key: RunKey = NO_KEY,
        beat_s: float = Settings.beat_s,
        substitute: bool = False,
    ) -> None:
        """`min_nodes`: an elastic job's MIN (--nnodes MIN:nodes); 0: a fixed job of `nodes`. `key`: the
        run's token key (none: the kit without a token)."""
        link = StoreLink("127.0.0.1", store.port, is_host=False, key=key)
        low = min_nodes or nodes
        settings = Settings(
            run_id, low, nodes, spare=spare, last_call_s=LAST_CALL_S, beat_s=beat_s, substitute=substitute
        )
        self.handler = KitRendezvous(link, settings)
        self._out: queue.Queue[object] = queue.Queue()
        Member.alive.append(self)

    def join(self) -> Member:
        def run() -> None:
            try:
                info = self.handler.next_rendezvous()
                self._out.put((self.handler.round, info.rank, info.world_size))
            except Exception as exc:  # handed to the test
                self._out.put(exc)

        threading.Thread(target=run, daemon=True).start()
        return self

    def result(self, timeout: float = WAIT_S) -> object:
        return self._out.get(timeout=timeout)

    def pending(self) -> bool:
        return self._out.empty()


class Remote:
    """A node in its own process (tests/training/rdzv_node.py): `stop()` silences it like a lost host."""

    def __init__(self, store: Store, nodes: int, run_id: str = "t", *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(NODE), store.endpoint, run_id, str(nodes), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[dict] = queue.Queue()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.put(json.loads(line))

        threading.Thread(target=read, daemon=True).start()

    def next(self, timeout: float = WAIT_S) -> dict:
        return self.lines.get(timeout=timeout)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def remotes() -> Iterator[list[Remote]]:
    started: list[Remote] = []
    yield started
    for r in started:
        if r.proc.poll() is None:
            r.kill()


def test_a_round_forms_and_a_rank_fault_reforms_on_the_same_nodes_with_the_same_ranks(store: Store) -> None:
    a, b = Member(store, 2), Member(store, 2)
    told: list[Joined] = []
    a.handler.on_round.append(told.append)  # the launcher's rdzv_round event
    a.join(), b.join()
    spare = Member(store, 2, spare=True).join()
    first = {a.result(), b.result()}
    assert {r[1] for r in first} == {0, 1} and {r[0] for r in first} == {1}
    ranks = {a: a.handler.members[a.handler.node], b: b.handler.members[b.handler.node]}
    assert b.handler.num_nodes_waiting() == 0  # the waiting spare does not make the members restart
    a.join()  # a's workers failed: it re-joins; b sees a node waiting and re-joins too (the agent's loop)
    eventually(lambda: b.handler.num_nodes_waiting() == 1)
    b.join()
    assert a.result() == (2, ranks[a], 2) and b.result() == (2, ranks[b], 2)
    assert spare.pending()  # both members were alive: no place for the spare
    assert [(j.round, j.rank, j.world) for j in told] == [(1, ranks[a], 2), (2, ranks[a], 2)]
    assert all(0 <= j.formed_at - j.asked_at < WAIT_S for j in told) and told[0].formed_at <= told[1].asked_at


def test_a_silent_node_is_judged_by_its_own_recent_beat_gaps() -> None:
    settings = Settings("t", 2, 2, beat_s=0.1, attempts=12)
    assert settings.verdict_s(0.105) == pytest.approx(0.315)  # a quiet host: 3x its longest recent gap
    assert settings.verdict_s(0.05) == pytest.approx(0.3)  # at least 3 beats
    assert settings.verdict_s(0.87) == pytest.approx(1.2)  # a host whose beats stalled keeps the expiry
    assert settings.verdict_s(float("inf")) == pytest.approx(1.2)  # too little history: the expiry
    assert parse_beat(beat_value(1765000000.25, 0.104)) == (1765000000.25, 0.104)
    assert parse_beat("1765000000.250") == (1765000000.25, float("inf"))  # a beat without its stall


def test_a_silent_node_gives_its_rank_to_the_spare_and_comes_back_as_a_spare(
    store: Store, remotes: list[Remote], caplog: pytest.LogCaptureFixture
) -> None:
    victim = Remote(store, 2)
    remotes.append(victim)
    a = Member(store, 2).join()
    spare = Member(store, 2, spare=True).join()
    assert victim.next()["round"] == 1
    a.result()
    lost_rank = 1 - a.handler.members[a.handler.node]
    victim_node = next(n for n in a.handler.members if n != a.handler.node)
    assert a.handler.gone_neighbour() is None  # it beats
    victim.stop()  # a lost host: its socket stays open, it never beats or answers again
    eventually(lambda: a.handler.gone_neighbour() is not None, timeout=5.0)  # what a's agent asks
    assert a.handler.gone_neighbour()[0] == victim_node
    with caplog.at_level(logging.WARNING, logger="kit.launch"):
        a.join()  # a's collectives failed
        assert spare.result() == (2, lost_rank, 2)
        assert a.result()[:2] == (2, 1 - lost_rank)
    assert "its last beat was" in caplog.text
    gone = next(r.getMessage() for r in caplog.records if "is gone" in r.getMessage())
    limit = float(gone.split("its limit ")[1].split(" s")[0])
    assert 0.3 <= limit <= 1.2  # the victim's own limit (3x its recent beat gap), at most the expiry
    # The host comes back (flaps): it is not in round 2, which is full, so it waits in the pool ...
    victim.cont()
    with pytest.raises(queue.Empty):
        victim.next(timeout=2.0)
    # ... and takes the place of the next member that leaves.
    spare.handler.depart()
    a.join()
    back = victim.next()
    assert (back["round"], back["rank"]) == (3, lost_rank) and a.result()[0] == 3


def test_with_in_place_restarts_a_newcomer_takes_a_lost_nodes_place_in_the_running_round(
    store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--rank-restart in-place`: the spare takes the lost node's rank in round 1 itself (no member
    re-joins: their workers wait for it in process), the round's result names it, a second newcomer does
    not take the same place, and takes rank 0's when its node is lost (the workers' stores are not there:
    the handler hands out its own store's address)."""
    for name in ("KIT_REJOIN", "KIT_RDZV_ROUND"):  # a launcher's own environment, set for its workers
        monkeypatch.delenv(name, raising=False)  # here the test's: gone again after it
    a, b, c = (Member(store, 3, substitute=True).join() for _ in range(3))
    results = {m: m.result() for m in (a, b, c)}
    by_rank = {r[1]: m for m, r in results.items()}
    lost, keeper = by_rank[1], by_rank[0]
    spare = Member(store, 3, spare=True, substitute=True).join()
    other = Member(store, 3, spare=True, substitute=True).join()
    with caplog.at_level(logging.WARNING, logger="kit.launch"):
        lost.handler.depart()  # a lost node (its beat says it left)
        eventually(lambda: not (spare.pending() and other.pending()), timeout=5.0)
    winner = other if spare.pending() else spare
    assert winner.result() == (1, 1, 3), "the lost rank, in the running round"
    assert "taking its place (rank 1) in the running round" in caplog.text
    assert keeper.handler.num_nodes_waiting() == 0, "the members re-form nothing"
    keeper.handler.membership.refresh()
    assert (
        keeper.handler.members[winner.handler.node] == 1 and lost.handler.node not in keeper.handler.members
    )
    loser = other if winner is spare else spare
    assert loser.pending(), "one newcomer per place"
    keeper.handler.depart()
    assert loser.result() == (1, 0, 3), "rank 0's place too"
    assert keeper.handler.use_agent_store and os.environ.get("KIT_RDZV_ROUND") == "1"


def test_a_node_that_leaves_is_replaced_without_waiting_for_its_beat_to_expire(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = Member(store, 3).join(), Member(store, 3).join(), Member(store, 3).join()
    spare = Member(store, 3, spare=True).join()
    a.result(), b.result(), c.result()
    b_rank = b.handler.members[b.handler.node]
    with caplog.at_level(logging.WARNING, logger="kit.launch"):
        b.handler.depart()  # drained or given up
        a.join(), c.join()
        assert spare.result() == (2, b_rank, 3)
        assert a.result()[0] == c.result()[0] == 2
    assert "it left" in caplog.text


def test_a_leader_lost_while_its_round_forms_is_replaced_and_a_joiner_that_never_wrote_is_skipped(
    store: Store, remotes: list[Remote], caplog: pytest.LogCaptureFixture
) -> None:
    leader = Remote(store, 3)
    remotes.append(leader)
    a, b = Member(store, 3).join(), Member(store, 3).join()
    spare = Member(store, 3, spare=True).join()
    assert leader.next()["round"] == 1
    a.result(), b.result()
    keys, link = a.handler.keys, a.handler.link
    link.call("add", keys.round(2, "count"), 1)  # a joiner lost between taking its index and writing its name
    # the remote node sees a node waiting, joins round 2 first and leads it
    eventually(lambda: link.read(keys.round(2, "leader")) is not None)
    leader.stop()  # lost while it leads
    with caplog.at_level(logging.WARNING, logger="kit.launch"):
        a.join(), b.join()
        assert spare.result()[0] == 2
        assert a.result()[0] == b.result()[0] == 2
    assert "leader" in caplog.text and "is gone" in caplog.text


def test_the_store_restarts_and_training_goes_on_then_the_next_change_works(
    store: Store, remotes: list[Remote]
) -> None:
    a, b = Member(store, 2).join(), Member(store, 2).join()
    spare = Member(store, 2, spare=True).join()
    a.result(), b.result()
    store.restart()  # the store's pod is rescheduled: every key is gone
    # The agents' membership checks reach the new store and find nothing to do: no restart.
    for m in (a, b):
        m.handler._waiting_cache = (0.0, 0)
        assert m.handler.num_nodes_waiting() == 0
        assert not m.handler.is_closed()
    # The next membership change: b leaves, a re-joins; the spare (registered again) takes b's place.
    b.handler.depart()
    a.join()
    assert spare.result()[0] == 2 and a.result()[0] == 2


def test_the_job_end_closes_the_rendezvous_a_waiting_spare_exits_gracefully(store: Store) -> None:
    a = Member(store, 1).join()
    spare = Member(store, 1, spare=True).join()
    assert a.result() == (1, 0, 1)
    assert a.handler.shutdown()
    assert isinstance(spare.result(), RendezvousGracefulExitError)
    late = Member(store, 1).join()
    assert isinstance(late.result(), RendezvousClosedError)


def test_an_elastic_job_takes_the_spare_first_then_shrinks_then_grows_back(store: Store) -> None:
    """--nnodes 2:3 with a hot spare: a member lost -> the spare takes its place (the world stays 3); another
    lost with no spare left -> the two re-form alone after the last call (a shrink); a node that joins later
    (the replacement) -> the members see it waiting and re-form with it (a grow)."""
    a, b, c = (Member(store, 3, min_nodes=2).join() for _ in range(3))
    spare = Member(store, 3, spare=True, min_nodes=2).join()
    assert {m.result()[2] for m in (a, b, c)} == {3}
    c.handler.depart()  # lost (a departed node is judged at once; a silent one at its beat's limit)
    a.join(), b.join()
    assert spare.result()[:3:2] == (2, 3) and a.result()[2] == b.result()[2] == 3
    spare.handler.depart()  # lost too: nobody left to take its place
    t0 = time.monotonic()
    a.join(), b.join()
    assert a.result()[:3:2] == b.result()[:3:2] == (3, 2)
    assert time.monotonic() - t0 >= LAST_CALL_S, "the two waited the last call for a replacement"
    late = Member(store, 3, min_nodes=2).join()  # the replacement pod, once capacity is back
    eventually(lambda: a.handler.num_nodes_waiting() == 1)  # what the agents see: a drain, then re-form
    a.join(), b.join()
    grown = [m.result() for m in (a, b, late)]
    assert {r[0] for r in grown} == {4} and {r[2] for r in grown} == {3}
    assert sorted(r[1] for r in grown) == [0, 1, 2]


def test_a_client_without_the_runs_token_cannot_join_mark_a_node_left_close_or_change_a_rounds_addresses(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's nodes hold its token; a stranger on the store's port finds every key (TCPStore lists them)
    and writes what would steer the run: `left` on a live member's beat, a join record and a counter bump
    for the next round, that round's result with its own endpoint, the closed mark; a client with a wrong
    token does the same. Every forged record is ignored with one line; the run re-forms on its own nodes with
    its own ranks and endpoints. (A beat interval of 60 s keeps the forged beat in place while it is read.)"""
    key = RunKey(os.urandom(32))
    a, b = Member(store, 2, key=key, beat_s=60.0).join(), Member(store, 2, key=key, beat_s=60.0).join()
    assert a.result()[0] == b.result()[0] == 1
    ranks = dict(a.handler.members)
    stranger = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False)
    beat_b = next(k for k in stranger.list_keys() if k.endswith(f"beat/{b.handler.node}"))
    prefix = beat_b[: -len(f"beat/{b.handler.node}")]
    assert prefix == a.handler.keys.prefix and prefix != "kit-rdzv/t/"  # the run's scope, from the token
    wrong = StoreLink("127.0.0.1", store.port, is_host=False, key=RunKey(os.urandom(32)))
    with caplog.at_level(logging.WARNING, logger="kit.launch"):
        stranger.set(beat_b, LEFT)
        assert a.handler.gone_neighbour() is None  # unsealed `left`: b is not gone
        wrong.write(beat_b, LEFT)
        assert a.handler.gone_neighbour() is None  # sealed with another token: b is not gone either
        stranger.set(beat_b, b"\xff\xfe left")  # not even text
        assert a.handler.gone_neighbour() is None
        stranger.set(prefix + "closed", "1")
        assert not a.handler.is_closed()
        index = stranger.add(prefix + "r2/count", 1)  # a joiner of round 2, pointing rank 0 at its own store
        stranger.set(prefix + f"r2/j{index}", json.dumps(["intruder", "10.9.9.9 29999"]))
        forged = {"ranks": {"intruder": 0, **{n: r + 1 for n, r in ranks.items()}}, "addrs": {}}
        stranger.set(prefix + "r2/result", json.dumps(forged))
        a.handler._waiting_cache = b.handler._waiting_cache = (0.0, 0)
        assert a.handler.num_nodes_waiting() == b.handler.num_nodes_waiting() == 0  # no restart for it
        a.join(), b.join()  # the members re-form (a rank fault): round 2 is theirs alone
        assert a.result() == (2, ranks[a.handler.node], 2) and b.result() == (2, ranks[b.handler.node], 2)
    assert a.handler.members == ranks and "intruder" not in b.handler.members
    assert all(not addr.startswith("10.9.9.9") for addr in a.handler.membership.addrs.values())
    refused = [r.getMessage() for r in caplog.records if "does not carry the run's token" in r.getMessage()]
    assert any(beat_b in line for line in refused) and any(prefix + "closed" in line for line in refused)
    assert any(f"r2/j{index}" in line for line in refused) and any("r2/result" in line for line in refused)
