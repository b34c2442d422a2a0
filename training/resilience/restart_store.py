"""The in-process restart's barrier store: rank 0 hosts it on its own port, every rank meets there once per
restart generation (fsdpkit.resilience.inprocess)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

import torch.distributed as dist

from fsdpkit.contracts import env
from fsdpkit.runtime.distributed import serve_store
from fsdpkit.runtime.run_token import run_key

if TYPE_CHECKING:
    from fsdpkit.runtime.distributed import DistContext


class RestartFailed(RuntimeError):
    """This rank cannot recover in process; the launcher must restart the group."""


BARRIER_POLL = timedelta(seconds=0.1)
"""How often a rank waiting in the restart barrier looks at whether it was asked to stop."""


class RestartStore:
    """The barrier's own TCPStore: rank 0 hosts it on a free port published through the job store (sealed
    with the run's key: a port a client without the run's token wrote is refused); under the kit's
    `--rank-restart in-place` the job store itself (the rendezvous' store, which no worker hosts)."""

    def __init__(self, ctx: DistContext, timeout_s: float) -> None:
        self.ctx = ctx
        self.timeout = timedelta(seconds=timeout_s)
        key = f"{run_key().scoped('kit/', 'inprocess')}{ctx.store_scope}/inprocess_store_port"
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        assert ctx.store is not None
        if os.environ.get(env.RDZV_ROUND) and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # the job store outlives every worker (the kit rendezvous' store, `--rank-restart in-place`):
            # the barrier lives there too, so the loss of rank 0 is a rank's loss like any other
            self.store = dist.PrefixStore(f"{key}/shared/", ctx.store)
            return
        if ctx.rank == 0:
            self.store = serve_store(host, 0, world_size=ctx.world_size, timeout=self.timeout)
            ctx.store.set(key, run_key().seal(key, str(self.store.port)))
            if ctx.world_size > 1:  # stay until every rank is connected: a run with nothing left to train
                ctx.store.wait([f"{key}/all"], self.timeout)  # would otherwise end and take the store along
        else:
            port = run_key().open(key, ctx.store.get(key).decode(errors="replace"))
            if port is None:
                raise RestartFailed(
                    f"the in-process store's port at {key} is not the run's (forged); refused"
                )
            self.store = dist.TCPStore(
                host, int(port), world_size=ctx.world_size, is_master=False, timeout=self.timeout
            )
            if ctx.store.add(f"{key}/joined", 1) == ctx.world_size - 1:
                ctx.store.set(f"{key}/all", "1")

    def _prefix(self, generation: int) -> str:
        return f"{run_key().scoped('', 'inprocess')}{self.ctx.store_scope}/gen{generation}"

    def announce(self, generation: int) -> None:
        """Say which generation the ranks restart into, for a worker started again in place (`joinable`)."""
        key = self._generation_key()
        self.store.set(key, run_key().seal(key, str(generation)))

    def joinable(self, timeout_s: float) -> int:
        """The generation whose barrier a worker started again in place must join: the newest one announced
        whose barrier is still open (its peers cannot pass it without this rank); RestartFailed when none
        opens within `timeout_s` (its peers never noticed, or restarted without it)."""
        key, deadline = self._generation_key(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.store.check([key]):
                value = run_key().open(key, self.store.get(key).decode(errors="replace"))
                if value is None:
                    raise RestartFailed(f"the restart generation at {key} is not the run's (forged); refused")
                if not self.store.check([f"{self._prefix(int(value))}/go"]):
                    return int(value)
            time.sleep(0.01)
        raise RestartFailed(
            f"rank {self.ctx.rank}: no in-process restart of its peers to rejoin within {timeout_s:.0f} s; "
            "exiting so the launcher restarts the group"
        )

    def _generation_key(self) -> str:
        return f"{run_key().scoped('', 'inprocess')}{self.ctx.store_scope}/generation"

    def barrier(self, generation: int, give_up: Callable[[], bool] = lambda: False) -> None:
        """Every rank arrives at `generation`'s barrier, or RestartFailed after the timeout, or at once when
        `give_up()` turns true (the launcher stops this worker: its group re-forms without the barrier)."""
        prefix = self._prefix(generation)
        arrived = self.store.add(f"{prefix}/arrived", 1)
        if arrived == self.ctx.world_size:
            self.store.set(f"{prefix}/go", "1")
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            try:
                self.store.wait([f"{prefix}/go"], BARRIER_POLL)
                return
            except dist.DistStoreError as exc:  # this slice timed out (a lost store is a DistNetworkError)
                if time.monotonic() >= deadline:
                    self._failed(prefix, generation, exc)
            except (RuntimeError, dist.DistError) as exc:
                self._failed(prefix, generation, exc)
            if give_up():
                raise RestartFailed(
                    f"rank {self.ctx.rank}: asked to stop (SIGTERM) while waiting in in-process restart "
                    f"barrier {generation}"
                )

    def _failed(self, prefix: str, generation: int, exc: BaseException) -> NoReturn:
        """RestartFailed, saying how many ranks reached the barrier."""
        arrived = self.store.add(f"{prefix}/arrived", 0)
        raise RestartFailed(
            f"rank {self.ctx.rank}: only {arrived}/{self.ctx.world_size} ranks reached in-process "
            f"restart barrier {generation} within {self.timeout.total_seconds():.0f} s "
            f"(a peer died or hangs); exiting so the launcher restarts the group"
        ) from exc
