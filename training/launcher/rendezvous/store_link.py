"""The node's link to the rendezvous store, and the store's keys of one run.

The store may restart (its pod rescheduled): every call goes through `StoreLink`, which reconnects to the
new store and has this node publish again what it knows: its beat, its pool entry, and, as a member, the
last round's number and result (every member writes the same bytes, so the order does not matter).
Training goes on: the workers' own store lives in their rank 0, not here. A round being formed when the
store restarts is formed again from scratch (`StoreReset`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousConnectionError

log = logging.getLogger("kit.launch")

STORE_TIMEOUT_S = 60.0
RECONNECT_S = 120.0
"""How long a node tries to reach the store again after losing it (its pod is rescheduled: seconds)."""


class Keys:
    """The store's keys of one run (one prefix: runs sharing a store never meet)."""

    def __init__(self, run_id: str) -> None:
        self.prefix = f"kit-rdzv/{run_id}/"

    def __getattr__(self, name: str) -> str:  # closed, last, pool_count; outcome: outcome.outcome_key
        return self.prefix + name

    def beat(self, node: str) -> str:
        return f"{self.prefix}beat/{node}"

    def invite(self, node: str) -> str:
        return f"{self.prefix}invite/{node}"

    def pool(self, index: int) -> str:
        return f"{self.prefix}pool/{index}"

    def round(self, t: int, name: str) -> str:
        return f"{self.prefix}r{t}/{name}"


def _values(args: tuple[Any, ...]) -> list[Any]:
    return [a() if callable(a) else a for a in args]


class StoreReset(Exception):
    """The store was lost and reached again while a round formed: it must be formed again."""


class StoreLink:
    """The node's TCPStore client, reconnecting when the store restarts (one lock: the beat thread and the
    agent's thread share it; TCPStore serialises calls on one client itself)."""

    def __init__(self, host: str, port: int, *, is_host: bool, timeout_s: float = STORE_TIMEOUT_S) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._lock = threading.Lock()
        self.generation = 0
        """How many times the store was reached again."""
        self.on_reconnect: list[Callable[[], object]] = []
        self.closed = False
        """Set when the node is done with the store: a lost store is then not reached again."""
        self.store = dist.TCPStore(
            host, port, is_master=is_host, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        if is_host:
            self.port = self.store.port  # port 0: the one the server took

    def call(self, method: str, *args: Any) -> Any:
        """The store call; after a lost store, once more on the store reached again (`generation` + 1).
        An argument that is a callable is evaluated at each try (a beat's clock: a retried beat must not
        write the time of the try that failed, older than the store's loss)."""
        generation = self.generation
        try:
            return getattr(self.store, method)(*_values(args))
        except dist.DistNetworkError as exc:
            self._reconnect(generation, exc)
        return getattr(self.store, method)(*_values(args))

    def _reconnect(self, generation: int, exc: BaseException) -> None:
        with self._lock:
            if self.generation != generation:
                return  # another thread reached the store again already
            if self.closed:
                raise RendezvousConnectionError("the rendezvous store is gone and this node is done with it")
            log.warning(
                "kit-launch: lost the rendezvous store (%s); reconnecting", " ".join(str(exc).split())
            )
            store = self._connect_again()
            store.set_timeout(timedelta(seconds=self.timeout_s))
            self.store = store
            self.generation += 1
            log.warning("kit-launch: reached the rendezvous store again; publishing this node's state")
        for hook in self.on_reconnect:
            hook()

    def _connect_again(self) -> dist.TCPStore:
        """A client of the store at the same address, tried every 0.2 s for RECONNECT_S."""
        deadline = time.monotonic() + RECONNECT_S
        while True:
            try:
                return dist.TCPStore(
                    self.host,
                    self.port,
                    is_master=False,
                    wait_for_workers=False,
                    timeout=timedelta(seconds=min(5.0, self.timeout_s)),
                )
            except (RuntimeError, dist.DistError) as again:
                if time.monotonic() > deadline:
                    raise RendezvousConnectionError(
                        f"the rendezvous store {self.host}:{self.port} is gone for {RECONNECT_S:g} s: {again}"
                    ) from again
                time.sleep(0.2)

    def wait_for(self, key: str, timeout_s: float, poll_s: float) -> bool:
        """Whether `key` exists within `timeout_s`, one `check` (a round trip, a few bytes) every `poll_s`.
        Not TCPStore's blocking wait: torch logs two warning lines at each of its timeouts."""
        deadline = time.monotonic() + timeout_s
        while not self.call("check", [key]):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def read(self, key: str) -> str | None:
        """The key's value, or None (never blocks: TCPStore's get waits for a missing key)."""
        if not self.call("check", [key]):
            return None
        return bytes(self.call("get", key)).decode()

    def read_many(self, keys: list[str]) -> list[str | None]:
        if not keys:
            return []
        if self.call("check", keys):
            return [bytes(v).decode() for v in self.call("multi_get", keys)]
        return [self.read(key) for key in keys]

    def counter(self, key: str) -> int:
        return int(self.call("add", key, 0))

    # torch Store's names, for what takes any store (outcome.record and outcome.read)
    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return bytes(self.call("compare_set", key, expected, desired))

    def check(self, keys: list[str]) -> bool:
        return bool(self.call("check", keys))

    def get(self, key: str) -> bytes:
        return bytes(self.call("get", key))


def names_this_machine(host: str) -> bool:
    """Whether `host` resolves to an address of this machine (a loopback, or its hostname's)."""
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None)}
        ours = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return any(addr.startswith("127.") or addr == "::1" or addr in ours for addr in theirs)
