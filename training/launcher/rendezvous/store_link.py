"""The node's link to the rendezvous store, and the store's keys of one run.

The store may restart (its pod rescheduled): every call goes through `StoreLink`, which reconnects to the
new store and has this node publish again what it knows: its beat, its pool entry, and, as a member, the
last round's number and result (every member writes the same bytes, so the order does not matter).
Training goes on: the workers' own store lives in their rank 0, not here. A round being formed when the
store restarts is formed again from scratch (`StoreReset`).

With the run's token (fsdpkit.runtime.run_token) the run's keys live under a scope derived from it, and every
record the nodes read back is sealed: `write` adds the tag, `read`/`read_many` return None for a record whose
tag does not check (a client without the token wrote it), so a stranger on the store's port cannot join,
mark a node `left`, close the rendezvous or change a round's endpoints.
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

from fsdpkit.runtime.distributed import serve_store
from fsdpkit.runtime.run_token import NO_KEY, RunKey

log = logging.getLogger("kit.launch")

STORE_TIMEOUT_S = 60.0
CLAIM_TRIES = 8
"""How many forged records in a row `claim` replaces before it gives up (a client racing it on purpose)."""
RECONNECT_S = 120.0
"""How long a node tries to reach the store again after losing it (its pod is rescheduled: seconds)."""


class Keys:
    """The store's keys of one run (one prefix: runs sharing a store never meet; with the run's token, under
    a scope only the run's pods can derive)."""

    def __init__(self, run_id: str, key: RunKey = NO_KEY) -> None:
        self.prefix = key.scoped(f"kit-rdzv/{run_id}/", f"rdzv/{run_id}")

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


def _text(value: bytes) -> str:
    """A stored value as text; bytes that are not UTF-8 (a stranger's) become U+FFFD and fail any seal."""
    return bytes(value).decode(errors="replace")


def _values(args: tuple[Any, ...]) -> list[Any]:
    return [a() if callable(a) else a for a in args]


class StoreReset(Exception):
    """The store was lost and reached again while a round formed: it must be formed again."""


class StoreLink:
    """The node's TCPStore client, reconnecting when the store restarts (one lock: the beat thread and the
    agent's thread share it; TCPStore serialises calls on one client itself)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        is_host: bool,
        timeout_s: float = STORE_TIMEOUT_S,
        key: RunKey = NO_KEY,
    ) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.key = key
        """The run's key: seals what this node writes, checks what it reads."""
        self._lock = threading.Lock()
        self.generation = 0
        """How many times the store was reached again."""
        self.on_reconnect: list[Callable[[], object]] = []
        self.closed = False
        """Set when the node is done with the store: a lost store is then not reached again."""
        timeout = timedelta(seconds=timeout_s)
        if is_host:  # on a loopback host, listening there only (serve_store)
            self.store = serve_store(host, port, timeout=timeout)
        else:
            self.store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timeout)
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

    def write(self, key: str, value: str | Callable[[], str]) -> None:
        """Set `key` to `value` sealed with the run's key (a callable: evaluated at each try, as `call`)."""
        if callable(value):
            make = value
            self.call("set", key, lambda: self.key.seal(key, make()))
        else:
            self.call("set", key, self.key.seal(key, value))

    def claim(self, key: str, expected: str | None, desired: str) -> str:
        """compare_set of sealed values (`expected` None: the key is absent); the value that stands after
        it. A record in the way that is not the run's (forged) counts as absent and is replaced."""
        old = "" if expected is None else self.key.seal(key, expected)
        new = self.key.seal(key, desired)
        for _ in range(CLAIM_TRIES):
            stood_raw = _text(self.call("compare_set", key, old, new))
            stood = self.key.open(key, stood_raw)
            if stood is not None:
                return stood
            old = stood_raw
        raise RendezvousConnectionError(
            f"the record at {key} is rewritten again and again by a client without the run's token"
        )

    def raw(self, key: str) -> str | None:
        """The key's stored bytes as they are (unchecked), or None when absent."""
        if not self.call("check", [key]):
            return None
        return _text(self.call("get", key))

    def read(self, key: str) -> str | None:
        """The key's value, or None: absent, or not sealed with the run's key (never blocks: TCPStore's get
        waits for a missing key)."""
        stored = self.raw(key)
        return None if stored is None else self.key.open(key, stored)

    def read_many(self, keys: list[str]) -> list[str | None]:
        if not keys:
            return []
        if self.call("check", keys):
            stored = [_text(v) for v in self.call("multi_get", keys)]
            return [self.key.open(k, v) for k, v in zip(keys, stored, strict=True)]
        return [self.read(key) for key in keys]

    def counter(self, key: str) -> int:
        return int(self.call("add", key, 0))

    # torch Store's names, for what takes any store (outcome.record and outcome.read): sealed values, and a
    # forged record reads as b"" (no record: outcome.RunOutcome.from_text gives None)
    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.claim(key, expected or None, desired).encode()

    def check(self, keys: list[str]) -> bool:
        return bool(self.call("check", keys))

    def get(self, key: str) -> bytes:
        return (self.key.open(key, _text(self.call("get", key))) or "").encode()


def names_this_machine(host: str) -> bool:
    """Whether `host` resolves to an address of this machine (a loopback, or its hostname's)."""
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None)}
        ours = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return any(addr.startswith("127.") or addr == "::1" or addr in ours for addr in theirs)
