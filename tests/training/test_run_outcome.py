"""The run's outcome beside the closed rendezvous (training/launcher/rendezvous/outcome.py), on a real
TCPStore: the first record stands, and a pod that finds the rendezvous closed reads why, on the kit's
rendezvous and on the c10d adapter alike."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters

from fsdpkit.launcher.rendezvous import KitRendezvous, Settings, StoreLink
from fsdpkit.launcher.rendezvous.c10d import create_c10d_handler
from fsdpkit.launcher.rendezvous.outcome import RecordsOutcome, RunOutcome, outcome_key, read, record

pytestmark = pytest.mark.timeout(60)
FAILED = RunOutcome(
    finished=False,
    code=75,
    reason="restart budget exhausted (--max-restarts=1); last failure: rank 0 exit code 1",
    closed_by="node 0 (pod run-0-local)",
)
FINISHED = RunOutcome(finished=True, code=0, reason="workers finished", closed_by="node 1")


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    host = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    yield host
    del host


def test_the_first_record_stands(store: dist.TCPStore) -> None:
    assert read(store, "r") is None
    assert record(store, "r", FAILED) == FAILED
    assert record(store, "r", FINISHED) == FAILED, "a node that leaves later never rewrites the cause"
    assert read(store, "r") == FAILED
    assert read(store, "other-run") is None  # one key per run
    assert FAILED.describe() == (
        "node 0 (pod run-0-local) exited 75: restart budget exhausted (--max-restarts=1); last failure: "
        "rank 0 exit code 1"
    )


@pytest.mark.parametrize("text", ["1", "", "{}", '{"finished": true}', "not json", '["a"]'])
def test_a_value_that_is_not_a_record_is_unknown(store: dist.TCPStore, text: str) -> None:
    """Unknown means what torch's closed rendezvous means: the run is over (a pod exits as before)."""
    store.set(outcome_key("r"), text)
    assert read(store, "r") is None
    assert RunOutcome.from_text(FINISHED.to_text()) == FINISHED


def test_the_kits_rendezvous_records_before_it_closes(store: dist.TCPStore) -> None:
    settings = Settings("r", 1, 1)
    closer = KitRendezvous(StoreLink("127.0.0.1", store.port, is_host=False), settings)
    late = KitRendezvous(StoreLink("127.0.0.1", store.port, is_host=False), settings)
    try:
        assert isinstance(closer, RecordsOutcome)
        assert late.recorded_outcome() is None
        assert closer.record_outcome(FAILED) == FAILED and closer.shutdown()
        assert late.is_closed() and late.recorded_outcome() == FAILED
        assert late.record_outcome(FINISHED) == FAILED
    finally:
        for handler in (closer, late):
            handler.link.closed = True
            handler.depart()


def test_the_c10d_adapter_records_beside_its_state(store: dist.TCPStore) -> None:
    def handler(node: str):  # type: ignore[no-untyped-def]
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{store.port}",
            run_id="r",
            min_nodes=1,
            max_nodes=1,
            local_addr=node,
            is_host="0",
        )
        return create_c10d_handler(params)

    closer, late = handler("a"), handler("b")
    assert isinstance(closer, RecordsOutcome)
    assert closer.record_outcome(FINISHED) == FINISHED and closer.shutdown()
    assert late.is_closed() and late.recorded_outcome() == FINISHED
    assert read(store, "r") == FINISHED  # the same key on either backend's store
