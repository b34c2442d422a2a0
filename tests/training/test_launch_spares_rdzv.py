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
