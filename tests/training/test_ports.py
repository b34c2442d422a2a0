"""MASTER_PORT comes with its two store ports free (fsdpkit.contracts.ports): the NVRx backend binds
MASTER_PORT+1 and +2 on rank 0, and a taken one meant EADDRINUSE on rank 0 and a 45 s hang on rank 1."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous import api as rendezvous_api

from fsdpkit.contracts.ports import free_port_run
from fsdpkit.launcher.rendezvous import c10d


def _free_run(count: int) -> int:
    """A port with `count` free ports from it, found without the code under test."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        try:
            with contextlib.ExitStack() as held:
                for p in range(port, port + count):
                    held.enter_context(socket.socket()).bind(("", p))
            return port
        except OSError:
            continue
    pytest.skip("no free run of ports on this machine")


@contextlib.contextmanager
def _client_on(port: int) -> Iterator[None]:
    """A connected client socket whose local port is `port`, as an ephemeral port of some connection is."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.bind(("127.0.0.1", port))
        client.connect(server.getsockname())
        with server.accept()[0]:
            yield


def test_a_port_whose_next_ports_are_taken_is_skipped() -> None:
    base = _free_run(9)  # three disjoint runs of 3: separate picks could return the same port
    taken_by_listener, taken_by_client, good = base, base + 3, base + 6
    with socket.socket() as listener, _client_on(taken_by_client + 2):
        listener.bind(("", taken_by_listener + 1))
        listener.listen()
        got = free_port_run(candidates=[taken_by_listener, taken_by_client, good])
    assert got == good


def test_no_free_run_is_an_error_naming_the_count() -> None:
    with pytest.raises(OSError, match="no run of 3 free TCP ports found in 2 tries"):
        free_port_run(candidates=[65534, 65535, _free_run(3)], tries=2)


def test_the_kit_rendezvous_gives_rank_0_a_port_run_that_is_free() -> None:
    """Rank 0 of a round publishes MASTER_PORT through torch's RendezvousStoreInfo.build."""
    c10d.install_join_fix()
    assert rendezvous_api.get_free_port is free_port_run
    for _ in range(10):
        port = rendezvous_api.RendezvousStoreInfo.build(0, HashStore(), "127.0.0.1").master_port
        with contextlib.ExitStack() as held:
            for p in range(port, port + 3):
                held.enter_context(socket.socket()).bind(("", p))
