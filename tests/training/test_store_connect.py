"""A rank that reaches rank 0's store before rank 0 listens waits for the listener instead of torch's
0.3-0.5 s connect retry (training/runtime/distributed.py `wait_for_listener`), on real sockets and a real
TCPStore."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from fsdpkit.contracts.ports import free_port_run
from fsdpkit.runtime import distributed
from fsdpkit.runtime.distributed import connect_store, wait_for_listener

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a probe of the listener was refused: the probing has begun and nobody listened yet. Every
    connect still goes to the real socket; this only watches the boundary."""
    seen = threading.Event()
    connect = socket.create_connection

    def watched(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        try:
            return connect(address, *args, **kwargs)
        except ConnectionRefusedError:
            seen.set()
            raise

    monkeypatch.setattr(distributed.socket, "create_connection", watched)
    return seen


def test_waits_for_a_listener_that_comes_late_and_gives_up_at_the_deadline(refused: threading.Event) -> None:
    port = free_port_run()
    assert wait_for_listener("127.0.0.1", port, deadline=time.monotonic() + 0.3) is False
    refused.clear()
    found: list[bool] = []
    prober = threading.Thread(
        target=lambda: found.append(wait_for_listener("127.0.0.1", port, deadline=time.monotonic() + 30))
    )
    prober.start()
    assert refused.wait(timeout=30), "the listener was never probed"
    with socket.create_server(("127.0.0.1", port)) as server:  # comes only after a refused probe
        server.settimeout(30)
        conn, _ = server.accept()
        conn.close()
    prober.join(timeout=30)
    assert found == [True]


def test_a_client_rank_started_before_rank_0_gets_a_working_store(
    monkeypatch: pytest.MonkeyPatch, refused: threading.Event
) -> None:
    port = free_port_run()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    client: list[dist.Store] = []
    thread = threading.Thread(target=lambda: client.append(connect_store(timedelta(seconds=30))))
    thread.start()
    assert refused.wait(timeout=30), "rank 1 never probed rank 0's port"  # nobody listens on it yet
    server = dist.TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    thread.join(timeout=40)
    assert client, "rank 1 never connected"
    client[0].set("from-rank-1", "ok")
    assert server.get("from-rank-1") == b"ok"  # the probes left the server serving
