"""The kit's c10d rendezvous (training/launcher/spares.py) on a real TCPStore with real handlers: a waiting
spare beats about once an interval (torch's test let it beat only every 1.2 intervals or more on the poll),
and a silently dead node's place goes to the spare in the next round."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError, RendezvousParameters

from training.launcher import spares

pytestmark = pytest.mark.timeout(60)
INTERVAL_S = 1.0
BEATS = 5


@pytest.fixture(autouse=True)
def _own_worker_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as the launcher runs it


def _handler(port: int):  # type: ignore[no-untyped-def]
    params = RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="t", min_nodes=2, max_nodes=2,
        is_host="0", local_addr="127.0.0.1", join_timeout="30",
    )  # fmt: skip
    return spares.c10d_handler(params, keep_alive_s=INTERVAL_S, attempts=2)


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
            spares._method_name(),
            torch_method_name(too_deep),
            spares._method_name(too_deep),
        )

    torch_method_name = spares._torch_method_name
    assert caller() == ("caller", "caller", "no_method_name", "no_method_name")


def test_a_restart_rejoins_without_the_first_join_skew(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch skews a join by a random 0-0.3 s while the state's round is 0, which it still is at the first
    restart; the kit keeps the skew for a node's first join only."""
    skews: list[tuple[str, object]] = []
    torch_delay = spares._torch_delay

    def recorded(seconds):  # type: ignore[no-untyped-def]
        if isinstance(seconds, tuple):
            skews.append((threading.current_thread().name, seconds))
        torch_delay(seconds)

    monkeypatch.setattr(spares, "_torch_delay", recorded)
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
    while len(seen) < BEATS:  # the spare sits in the redundancy list and beats from its state poll
        seen.update(_beats(reader, node))
        time.sleep(0.02)
    times = sorted(seen)
    gaps = [(y - x).total_seconds() for x, y in itertools.pairwise(times)]
    assert reader._state_holder.state.redundancy_list == {node}
    assert min(gaps) >= INTERVAL_S * spares.BEAT_DUE  # never more often than due
    assert min(gaps) < INTERVAL_S  # impossible under torch's test (a whole interval, on a 0.2 s poll)

    b._stop_heartbeats()  # b's node dies silently: its keep-alive expires, the spare takes its place
    a._stop_heartbeats()  # a's worker failed: its agent forms the next round
    a.next_rendezvous()
    waiting.join(timeout=30)
    assert spare_round and spare_round[0] is not None
    _beats(reader, node)
    state = reader._state_holder.state
    assert set(state.participants) == {a._this_node, node} and state.round == 1
    assert a._state_holder._cache_duration == spares.TRAINING_CACHE_S  # back to torch's for training
    for h in (a, spare):
        h.shutdown()
