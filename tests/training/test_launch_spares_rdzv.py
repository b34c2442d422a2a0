"""The kit's c10d rendezvous (training/launcher/rendezvous/c10d.py) on a real TCPStore with real handlers: a
waiting spare beats about once an interval (torch's test let it beat only every 1.2 intervals or more on the
poll), and a silently dead node's place goes to the spare in the next round."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError, RendezvousParameters

from fsdpkit.launcher.rendezvous import c10d
from fsdpkit.launcher.rendezvous.ranks import stable_ranks

pytestmark = pytest.mark.timeout(60)
INTERVAL_S = 1.0
BEATS = 5
WAIT_S = 30.0
"""The longest wait for a state the rendezvous must reach (the tests' own limit is 60 s)."""


@pytest.fixture(autouse=True)
def _own_worker_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as the launcher runs it


def _handler(port: int):  # type: ignore[no-untyped-def]
    params = RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="t", min_nodes=2, max_nodes=2,
        is_host="0", local_addr="127.0.0.1", join_timeout="30",
    )  # fmt: skip
    return c10d.c10d_handler(params, keep_alive_s=INTERVAL_S, attempts=2)


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout_s:g} s waiting for {what}"
        time.sleep(0.02)


def _beats(handler, node) -> list:  # type: ignore[no-untyped-def]
    """The node's keep-alive times seen so far in the store's state (read through `handler`)."""
    holder = handler._state_holder
    holder._cache_duration = 0
    holder.sync()
    return [t for n, t in holder.state.last_heartbeats.items() if n == node]


def test_the_cheap_method_name_names_what_torchs_names() -> None:
    def caller() -> tuple[str, str, str, str]:
        return callee()

    def callee() -> tuple[str, str, str, str]:
        too_deep = 10_000
        return (
            torch_method_name(),
            c10d._method_name(),
            torch_method_name(too_deep),
            c10d._method_name(too_deep),
        )

    torch_method_name = c10d._torch_method_name
    assert caller() == ("caller", "caller", "no_method_name", "no_method_name")


def test_a_restart_rejoins_without_the_first_join_skew(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch skews a join by a random 0-0.3 s while the state's round is 0, which it still is at the first
    restart; the kit keeps the skew for a node's first join only."""
    skews: list[tuple[str, object]] = []
    torch_delay = c10d._torch_delay

    def recorded(seconds):  # type: ignore[no-untyped-def]
        if isinstance(seconds, tuple):
            skews.append((threading.current_thread().name, seconds))
        torch_delay(seconds)

    monkeypatch.setattr(c10d, "_torch_delay", recorded)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    a, b = _handler(store.port), _handler(store.port)
    rounds: dict[str, list[int]] = {"a": [], "b": []}

    def join(name: str, handler) -> None:  # type: ignore[no-untyped-def]
        info = handler.next_rendezvous()
        rounds[name].append(info.world_size)

    for attempt in ("first", "restart"):
        threads = [
            threading.Thread(target=join, args=(n, h), name=f"{n}-{attempt}") for n, h in (("a", a), ("b", b))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=40)
        assert not any(t.is_alive() for t in threads), f"the {attempt} rendezvous did not form"
    assert rounds == {"a": [2, 2], "b": [2, 2]}
    assert sorted(name for name, _ in skews) == ["a-first", "b-first"], skews
    assert a._state_holder.state.round == 1  # the restart formed the next round, not the same one


@pytest.mark.slow
def test_a_waiting_spare_beats_every_interval_and_takes_a_silent_nodes_place() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    a, b, spare, reader = (_handler(store.port) for _ in range(4))
    threads = [threading.Thread(target=h.next_rendezvous) for h in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spare_round: list = []

    def wait_as_spare() -> None:
        try:
            spare_round.append(spare.next_rendezvous())
        except RendezvousGracefulExitError:
            spare_round.append(None)

    waiting = threading.Thread(target=wait_as_spare, daemon=True)
    waiting.start()
    node = spare._this_node
    seen: set = set()

    def beaten() -> bool:  # the spare sits in the redundancy list and beats from its state poll
        seen.update(_beats(reader, node))
        return len(seen) >= BEATS

    _wait_until(beaten, f"{BEATS} keep-alives of the waiting spare")
    times = sorted(seen)
    gaps = [(y - x).total_seconds() for x, y in itertools.pairwise(times)]
    assert reader._state_holder.state.redundancy_list == {node}
    assert min(gaps) >= INTERVAL_S * c10d.BEAT_DUE  # never more often than due
    assert min(gaps) < INTERVAL_S  # impossible under torch's test (a whole interval, on a 0.2 s poll)

    b._stop_heartbeats()  # b's node dies silently: its keep-alive expires, the spare takes its place
    a._stop_heartbeats()  # a's worker failed: its agent forms the next round
    a.next_rendezvous()
    waiting.join(timeout=30)
    assert spare_round and spare_round[0] is not None
    _beats(reader, node)
    state = reader._state_holder.state
    assert set(state.participants) == {a._this_node, node} and state.round == 1
    assert a._state_holder._cache_duration == c10d.TRAINING_CACHE_S  # back to torch's for training
    for h in (a, spare):
        h.shutdown()


def test_stable_ranks_keep_a_members_rank_and_give_newcomers_the_free_ones() -> None:
    a, b, c, s = "a", "b", "c", "s"
    assert stable_ranks({}, [a, b, c]) == {a: 0, b: 1, c: 2}  # the first round: torch's order
    assert stable_ranks({a: 0, b: 1, c: 2}, [a, c, s]) == {a: 0, c: 2, s: 1}  # s takes lost b's
    assert stable_ranks({a: 0, b: 1, c: 2}, [b, c, s]) == {b: 1, c: 2, s: 0}  # pod 0 lost
    assert stable_ranks({a: 0, b: 1, c: 2}, [c, s]) == {c: 0, s: 1}  # shrunk: 2 out of range
    assert stable_ranks({a: 1, b: 1}, [a, b]) == {a: 1, b: 0}  # never two nodes on one rank


def _join_all(handlers: dict[str, object], delays: dict[str, float]) -> dict[str, int]:
    """Each handler re-joins after its delay (a node still stopping its workers); name -> rank."""
    ranks: dict[str, int] = {}

    def join(name: str) -> None:
        time.sleep(delays.get(name, 0.0))
        ranks[name] = handlers[name].next_rendezvous().rank  # type: ignore[attr-defined]

    threads = [threading.Thread(target=join, args=(n,)) for n in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert not any(t.is_alive() for t in threads), "the round did not form"
    return ranks


@pytest.mark.slow
def test_a_rank_fault_restarts_on_the_same_nodes_and_a_lost_node_gives_its_rank_to_the_spare() -> None:
    """A group restart (a rank fault) re-forms with the same nodes and ranks, however slowly a member comes
    back, while a spare waits (torch let the spare take the place of whichever member re-joined last, about
    half the time); a node that is gone leaves its place and its rank to the spare."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    a, b, spare, reader = (_handler(store.port) for _ in range(4))
    first = _join_all({"a": a, "b": b}, {})
    spare_round: list = []
    waiting = threading.Thread(target=lambda: spare_round.append(spare.next_rendezvous()), daemon=True)
    waiting.start()
    node = spare._this_node
    _wait_until(lambda: node in _state(reader).redundancy_list, "the spare in the redundancy list")
    for slow in ("a", "b", "a"):  # the member that re-joins late: its keep-alive runs meanwhile
        assert _join_all({"a": a, "b": b}, {slow: 1.5 * INTERVAL_S}) == first
        assert not spare_round and node in _state(reader).redundancy_list
    b._stop_heartbeats()  # b's node is lost: its keep-alive expires, the spare takes its place and rank
    assert _join_all({"a": a}, {}) == {"a": first["a"]}
    waiting.join(timeout=30)
    assert spare_round and spare_round[0].rank == first["b"]
    for h in (a, spare):
        h.shutdown()


def _state(handler):  # type: ignore[no-untyped-def]
    holder = handler._state_holder
    holder._cache_duration = 0
    holder.sync()
    return holder.state
