"""A TCPStore server that listens only where it is asked to on a loopback host.

torch's TCPServer binds the wildcard address whatever host name it is given; `serve_store` binds a loopback
host's listening socket itself and hands it to torch (`master_listen_fd`), so a local run's stores are not
reachable from the machine's network. Its own module, importing only torch's TCPStore: the rendezvous store's
pod imports it, and a restarted store is back as soon as it can be (the nodes' reconnect window).
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

from torch.distributed import TCPStore


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`): a store for this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_store(host: str, port: int, *, world_size: int | None = None, timeout: timedelta) -> TCPStore:
    """A TCPStore server for `host:port` (port 0: any free one). On a loopback host it listens on that
    address only: the socket is bound here and handed to torch (`master_listen_fd`, libuv's
    `uv_tcp_open` takes it over); elsewhere (a pod's IP) torch listens on every interface, as before.
    OSError when the port cannot be bound."""
    if not is_loopback(host):
        return TCPStore(
            host, port, world_size=world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
    addr = "::1" if host == "::1" else "127.0.0.1" if host == "localhost" else host
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted store takes its port back
        sock.bind((addr, port))
        sock.listen(socket.SOMAXCONN)
        bound = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    return TCPStore(
        host, bound, world_size=world_size, is_master=True, timeout=timeout, wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )  # fmt: skip
