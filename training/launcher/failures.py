"""Why the worker group broke: what the next restart says, how the group stops, what the launcher exits with.

A worker that exited FATAL_CONFIG (78) spends the whole budget (never retried). The first of a group's
failures (by exit time, to the millisecond) is the one logged and named at the exit; a first failure by a
signal counts against the node (`OwnFailures`), its peers then die of it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup

from fsdpkit.contracts import exitcodes
from fsdpkit.launcher.budget import RestartBudget
from fsdpkit.launcher.exits import WorkerExits, describe_exit
from fsdpkit.launcher.monitor import HeartbeatMonitor
from fsdpkit.launcher.node_failures import OwnFailures
from fsdpkit.runtime.events import EventLog

log = logging.getLogger("kit.launch")


@dataclass(frozen=True, kw_only=True)
class Break:
    """Why the group broke, and when it was found: the next restart's line says both."""

    reason: str
    detected_at: float


class FailureRecord:
    """The group's breaks and failures, from the worker exits and the hang checks."""

    def __init__(
        self,
        *,
        monitor: HeartbeatMonitor,
        events: EventLog,
        exits: WorkerExits,
        own_failures: OwnFailures,
        budget: RestartBudget,
        rejoin_timeout_s: float | None,
    ) -> None:
        self.monitor = monitor
        self.events = events
        self.exits = exits
        self.own_failures = own_failures
        self.budget = budget
        self.rejoin_timeout_s = rejoin_timeout_s
        """Set with more than one node: how long a broken group waits for every node to re-form."""
        self.broken = False
        """The group failed or hung: it is SIGKILLed, not asked to drain."""
        self.fatal = False
        self.last_failure = ""
        self._pending: Break | None = None

    def take_pending(self) -> Break | None:
        """The break that the restart now starting answers (None: another node restarted); clears it."""
        pending, self._pending, self.broken = self._pending, None, False
        return pending

    def mark_broken(self, reason: str) -> None:
        self.broken = True
        self._pending = Break(reason=reason, detected_at=time.time())
        if reason.startswith("hang"):
            self.last_failure = reason
        if self.rejoin_timeout_s is not None and self.budget.remaining() > 0:
            log.warning(
                "kit-launch: the group re-forms: waiting up to %g s for every node (a spare, the lost "
                "node's replacement pod or the same nodes) before giving up (rendezvous join_timeout)",
                self.rejoin_timeout_s,
            )

    def workers_failed(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
        """Log the first failure, an event per failed worker; a fatal config spends the budget."""
        # The earliest exit, to the millisecond (torchelastic's own stamps are whole seconds, taken when it
        # polls): the peers of a killed rank die of the broken collective a few ms after it.
        first = min(
            result.failures.values(),
            key=lambda f: (self.exits.exit_time(f.pid) or float("inf"), f.timestamp, f.local_rank),
        )
        for global_rank, failure in sorted(result.failures.items()):
            worker = next(w for w in worker_group.workers if w.global_rank == global_rank)
            last = self.monitor.last_beat(global_rank)
            since = f"; {time.time() - last:.2f} s after its last heartbeat" if last is not None else ""
            reason = describe_exit(failure.exitcode)
            if failure is first:
                log.warning(
                    "kit-launch: worker failed: rank %d (local %d, pid %s): %s%s",
                    global_rank,
                    worker.local_rank,
                    failure.pid,
                    reason,
                    since,
                )
            self.events.emit(
                "worker_failed",
                local_rank=worker.local_rank,
                global_rank=global_rank,
                exitcode=failure.exitcode,
                reason=reason,
                first=failure is first,
            )
        first_rank = next(r for r, f in result.failures.items() if f is first)
        self.last_failure = f"rank {first_rank} {describe_exit(first.exitcode)}"
        if any(f.exitcode == exitcodes.FATAL_CONFIG for f in result.failures.values()):
            self.fatal = True
            self.budget.spend()  # the inherited loop stops instead of retrying
            log.error(
                "kit-launch: a worker exited %d (fatal config): not retrying; fix the config and resubmit",
                exitcodes.FATAL_CONFIG,
            )
        if first.exitcode < 0 and not self.fatal:  # the first exit: its peers then die of it (or are killed)
            self.own_failures.count(time.time(), f"rank {first_rank} {describe_exit(first.exitcode)}")
        self.mark_broken(self.last_failure)
        return result
