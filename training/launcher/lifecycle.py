"""Starts and stops of the worker group, around torchelastic's own.

A start counts the attempt, says why a restart happens and how long after detection, and gives the workers
fresh heartbeat clocks (through the env they copy at spawn, which the shim sends on under the zygote).
A stop SIGKILLs a broken group (failed or hung) at once: a hung or SIGSTOPped rank never honours SIGTERM, and
its peers are stuck in collectives anyway. So is a group with a rank outside the train loop (starting,
loading, or restarting in process because a peer on another node died): SIGTERM asks a trainer to drain at
its next step boundary, which such a rank never reaches. Otherwise (signal to the launcher, end of run, a new
round while every rank trains) torchelastic's SIGTERM-then-wait. Under the zygote the stop then waits for
the workers themselves, not only their shims.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerGroup

from fsdpkit.launcher.budget import RestartBudget
from fsdpkit.launcher.exits import WorkerExits
from fsdpkit.launcher.failures import Break
from fsdpkit.launcher.monitor import HeartbeatMonitor
from fsdpkit.launcher.zygote import Zygote
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.heartbeat import HEARTBEAT_DIR_ENV

log = logging.getLogger("kit.launch")
BROKEN_GROUP_KILL_TIMEOUT_S = 10
WORKER_EXIT_NOTICE_S = 0.5
"""A stopped group's workers that take this long to exit are logged (under the zygote, see
`GroupLifecycle.await_zygote_workers`)."""


class GroupLifecycle:
    """What the agent does before and after torchelastic starts or stops the worker group."""

    def __init__(
        self,
        *,
        monitor: HeartbeatMonitor,
        events: EventLog,
        exits: WorkerExits,
        budget: RestartBudget,
        zygote: Zygote | None,
    ) -> None:
        self.monitor = monitor
        self.events = events
        self.exits = exits
        self.budget = budget
        self.zygote = zygote
        self.attempt = -1
        """The group's starts so far, less one: 0 is the first start, each restart adds one."""

    def starting(self, worker_group: WorkerGroup, pending: Break | None) -> None:
        """Count the start (a restart logs and emits why: `pending`, or another node's restart), and point
        the workers' env at fresh heartbeat clocks."""
        self.attempt += 1
        if self.attempt > 0:
            found = pending if pending is not None and pending.reason else None
            reason = found.reason if found else "another node restarted (rendezvous)"
            since = f" {time.time() - found.detected_at:.2f} s after detection" if found else ""
            log.warning(
                "kit-launch: restart %d: starting the worker group again%s (%s; %d/%d restarts left)",
                self.attempt,
                since,
                reason,
                self.budget.remaining(),
                worker_group.spec.max_restarts,
            )
            self.events.emit(
                "restart", attempt=self.attempt, reason=reason, remaining=self.budget.remaining()
            )
        # the workers' env is the launcher's, copied at spawn (and sent on by the shim under the zygote)
        os.environ[HEARTBEAT_DIR_ENV] = str(self.monitor.reset([w.global_rank for w in worker_group.workers]))

    def started(self, worker_group: WorkerGroup, pids: dict[int, Any]) -> None:
        self.events.emit(
            "group_started", attempt=self.attempt, ranks=[w.global_rank for w in worker_group.workers]
        )
        self.exits.watch(list(pids.values()))

    def stop_signal(
        self, death_sig: signal.Signals, timeout: int, *, broken: bool
    ) -> tuple[signal.Signals, int]:
        """The signal and wait that stop the group: SIGKILL when it is broken or has nothing to drain."""
        if broken:
            return signal.SIGKILL, BROKEN_GROUP_KILL_TIMEOUT_S
        if death_sig == signal.SIGTERM and (outside := self._ranks_outside_the_loop()):
            # SIGTERM asks a trainer to drain at its next step boundary; a rank that is starting, loading or
            # restarting in process (its peer on another node died) has none to reach, and would hold the
            # new round for the whole timeout (30 s, measured) before torchelastic's SIGKILL.
            log.warning(
                "kit-launch: stopping the worker group: rank(s) %s outside the train loop (starting, loading "
                "or restarting in process), nothing to drain: SIGKILL",
                ", ".join(map(str, outside)),
            )
            return signal.SIGKILL, BROKEN_GROUP_KILL_TIMEOUT_S
        return death_sig, timeout

    def await_zygote_workers(self) -> None:
        """torchelastic waited for the shims; under the zygote their workers may still be exiting (a
        SIGKILLed shim's worker is killed by the zygote a moment later; a GPU worker frees its memory on
        the way out). The next attempt starts once they are gone, or after a bounded wait, said."""
        if self.zygote is None:
            return
        t0 = time.monotonic()
        alive = self.zygote.wait_workers_gone(BROKEN_GROUP_KILL_TIMEOUT_S)
        waited = time.monotonic() - t0
        if alive:
            log.warning(
                "kit-launch: worker process(es) %s still running %.0f s after the group was stopped "
                "(stuck in the kernel or a driver?); going on without them",
                ", ".join(map(str, alive)),
                waited,
            )
        elif waited >= WORKER_EXIT_NOTICE_S:
            log.info("kit-launch: the stopped workers took %.2f s to exit", waited)

    def _ranks_outside_the_loop(self) -> list[int]:
        return sorted(rank for rank, phase in self.monitor.phases().items() if phase in ("start", "load"))
