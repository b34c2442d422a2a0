"""Hang handling: the heartbeat checks that follow torchelastic's own on a healthy group.

A stale heartbeat makes the group UNHEALTHY, so the inherited restart path runs, unless a local rank's
training thread or gloo thread is still busy on a CPU (`CpuActivity`): a slow, contended step, or its peers
waiting for one, gets more time, up to the busy cap (`HeartbeatMonitor.busy_cap_s`); a hung rank and its
peers waiting in a collective are idle, so a real hang is still found at the timeout (plus a tick). The hung
rank is blamed among the silent ones (training/launcher/blame.py) and, when its trainer takes it, first
interrupted in place. A node of the last round whose rendezvous beat stopped breaks the group at once.
Each detection logs one line with its time to detection and emits an event.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.rendezvous import RendezvousError

from fsdpkit.launcher.activity import CpuActivity
from fsdpkit.launcher.blame import Probe, culprit, probe
from fsdpkit.launcher.failures import FailureRecord
from fsdpkit.launcher.monitor import HeartbeatMonitor, Stale
from fsdpkit.launcher.node_failures import OwnFailures
from fsdpkit.launcher.rendezvous import KitRendezvous
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.hang_interrupt import INTERRUPT_SIGNAL

log = logging.getLogger("kit.launch")
BUSY_WINDOW_TICKS = 2
"""A training thread is busy if it ran (or waited for a CPU) during the last this many monitor intervals."""
PEER_CHECK_SHARE = 0.5
"""A local rank silent for this share of its timeout makes the launcher read its ring neighbours' rendezvous
beats (`KitRendezvous.gone_neighbour`), at most once a beat."""


@dataclass(kw_only=True)
class _Interrupted:
    """A hung rank sent the hang interrupt, and what the group restart needs if it does not answer."""

    stale: Stale
    probes: list[Probe]
    pid: int
    beat: float | None
    """Its last beat when interrupted: any other value is its answer."""
    at: float
    deadline: float
    answered: bool = False


class HangWatch:
    """The heartbeat checks of a healthy group; `check` returns the result the inherited loop acts on."""

    def __init__(
        self,
        *,
        monitor: HeartbeatMonitor,
        events: EventLog,
        stacks_dir: str,
        failures: FailureRecord,
        own_failures: OwnFailures,
        activity: CpuActivity,
    ) -> None:
        self.monitor = monitor
        self.events = events
        self.stacks_dir = stacks_dir
        self.failures = failures
        self.own_failures = own_failures
        self.activity = activity
        self._extended: tuple[Stale, list[int]] | None = None  # the silence given more time, who was busy
        self._interrupted: _Interrupted | None = None  # a hung rank interrupted in place, not yet beaten
        self._peer_checked_at = 0.0

    def forget(self) -> None:
        """A new worker group: nothing extended or interrupted, no old CPU readings."""
        self._extended = None
        self._interrupted = None
        self.activity.forget()

    def check(self, worker_group: WorkerGroup, result: RunResult, now: float) -> RunResult:
        """torchelastic's HEALTHY `result`, or UNHEALTHY when a rank hung or a node of the round is gone (the
        inherited restart path then runs)."""
        stale = self.monitor.check(now)
        self.activity.sample(self.monitor.pids(), now)
        if (waiting := self._await_interrupt(now)) is not None:
            return waiting
        if stale is None:
            self._end_extension()
            if (gone := self._gone_peer(worker_group, now)) is not None:
                return self._restart_for_gone_peer(*gone)
            return result
        busy = self.activity.busy_ranks()
        if busy and stale.stale_s <= self.monitor.busy_cap_s(stale.timeout_s):
            self._extended = (stale, busy)
            return result
        extension_s = stale.stale_s - stale.timeout_s if self._extended is not None else 0.0
        self._extended = None
        stale, probes = self._blame_hang(stale, now)
        if self._interrupt_hung_rank(stale, probes, now, extension_s):
            return result
        self._declare_hang(stale, probes, now, extension_s, action="restart")
        self._restart_for_hang(stale, probes, now)
        return RunResult(state=WorkerState.UNHEALTHY)

    def _gone_peer(self, worker_group: WorkerGroup, now: float) -> tuple[str, str] | None:
        """A node of the last round whose rendezvous beat stopped, looked for while a local rank has been
        silent for PEER_CHECK_SHARE of its timeout (at most once a beat): a host that went silent hangs its
        peers' collectives without closing a socket, and its beat tells it at 3x its own beat gap, where
        the hang is seen at 1.5x the slowest step."""
        handler = worker_group.spec.rdzv_handler
        if not isinstance(handler, KitRendezvous) or now - self._peer_checked_at < handler.settings.beat_s:
            return None
        if not any(s.stale_s >= PEER_CHECK_SHARE * s.timeout_s for s in self.monitor.silent(now)):
            return None
        self._peer_checked_at = now
        try:
            return handler.gone_neighbour()
        except (RendezvousError, RuntimeError) as exc:  # the store is away: the hang check still runs
            log.warning("kit-launch: could not read the neighbours' rendezvous beats: %s", exc)
            return None

    def _restart_for_gone_peer(self, node: str, why: str) -> RunResult:
        """Break the group at once (not this node's failure): the round re-forms without the lost node."""
        log.warning(
            "kit-launch: node %s of the last round is gone (%s) while a local rank waits: restarting the "
            "group to re-form without it",
            node,
            why,
        )
        self.events.emit("peer_gone", node=node, reason=why)
        self.failures.mark_broken(f"node {node} is gone")
        return RunResult(state=WorkerState.UNHEALTHY)

    def _declare_hang(
        self, stale: Stale, probes: list[Probe], now: float, extension_s: float, *, action: str
    ) -> None:
        """One log line and a `hang_detected` event; `action`: "restart" (the group) or "interrupt" (the
        rank, in place: `_interrupt_hung_rank`)."""
        reason = (
            f"rank {stale.rank} heartbeat stale for {stale.stale_s:.2f} s "
            f"(timeout {stale.timeout_s:.2f} s, phase {stale.phase}, last step {stale.step}"
            + (f"; {extension_s:.2f} s more given while a rank was busy on a CPU" if extension_s else "")
            + ")"
        )
        then = (
            f"; interrupting it in place ({INTERRUPT_SIGNAL.name}); the group restarts if it does not beat "
            f"within {self.monitor.settings.interrupt_grace_s:g} s"
            if action == "interrupt"
            else ""
        )
        log.warning("kit-launch: hang detected: %s%s%s", reason, describe_probes(probes), then)
        self.events.emit(
            "hang_detected",
            ts=now,
            global_rank=stale.rank,
            stale_s=round(stale.stale_s, 4),
            timeout_s=round(stale.timeout_s, 4),
            busy_extension_s=round(extension_s, 4),
            busy_ranks=self.activity.busy_ranks(),
            phase=stale.phase,
            step=stale.step,
            ranks={str(p.rank): p.state for p in probes},
            where=next((p.where for p in probes if p.rank == stale.rank), ""),
            action=action,
        )

    def _restart_for_hang(self, stale: Stale, probes: list[Probe], now: float) -> None:
        """Count the hang against this node when a local rank is the culprit, and break the group."""
        culprit_probe = next((p for p in probes if p.rank == stale.rank), None)
        if culprit_probe is None or culprit_probe.state in ("stopped", "elsewhere"):
            self.own_failures.count(now, f"hang of rank {stale.rank}")
        self.failures.mark_broken(f"hang of rank {stale.rank}")

    def _interrupt_hung_rank(self, stale: Stale, probes: list[Probe], now: float, extension_s: float) -> bool:
        """Interrupt the hung rank in place when its trainer takes it (it restarts in process: 0.1-0.4 s on
        the test machine, from the live state, where a group restart starts new processes and reads the
        checkpoint).
        A stopped rank cannot run the handler; one without a pid here is another node's to interrupt."""
        grace = self.monitor.settings.interrupt_grace_s
        pid = self.monitor.pid(stale.rank)
        state = next((p.state for p in probes if p.rank == stale.rank), None)
        if grace <= 0 or pid is None or state == "stopped" or not self.monitor.interruptible(stale.rank):
            return False
        try:
            os.kill(pid, INTERRUPT_SIGNAL)
        except ProcessLookupError:
            return False  # it exited: the stock check sees that at the next tick
        self._interrupted = _Interrupted(
            stale=stale,
            probes=probes,
            pid=pid,
            beat=self.monitor.last_beat(stale.rank),
            at=now,
            deadline=now + grace,
        )
        self._declare_hang(stale, probes, now, extension_s, action="interrupt")
        return True

    def _await_interrupt(self, now: float) -> RunResult | None:
        """While an interrupted rank has not beaten again: HEALTHY until the grace is over (its peers'
        silence is its), then the group restart. Once it beat (it restarts in process), HEALTHY until its
        local peers beat too (they restart once its abort breaks their collective) or the grace is over;
        then None: the ordinary checks again."""
        pending = self._interrupted
        if pending is None:
            return None
        rank = pending.stale.rank
        if not pending.answered and (
            self.monitor.last_beat(rank) != pending.beat or self.monitor.pid(rank) != pending.pid
        ):
            pending.answered = True
            log.info("kit-launch: rank %d answered the hang interrupt: it restarts in process", rank)
        if pending.answered:
            beats = [self.monitor.last_beat(r) for r in self.monitor.pids()]
            if now < pending.deadline and any(b is None or b < pending.at for b in beats):
                return RunResult(state=WorkerState.HEALTHY)
            self._interrupted = None
            return None
        if now < pending.deadline:
            return RunResult(state=WorkerState.HEALTHY)
        self._interrupted = None
        grace = self.monitor.settings.interrupt_grace_s
        log.warning(
            "kit-launch: rank %d did not beat within %g s of the hang interrupt (stuck outside Python, e.g. "
            "in C, a CUDA kernel or a collective): restarting the group",
            rank,
            grace,
        )
        self.events.emit(
            "hang_interrupt_unanswered", global_rank=rank, grace_s=grace, step=pending.stale.step
        )
        self._restart_for_hang(pending.stale, pending.probes, now)
        return RunResult(state=WorkerState.UNHEALTHY)

    def _end_extension(self) -> None:
        """A silence that was given more time ended in a beat: one log line and a `busy_extension` event
        (each one a restart the busy check saved; many of them say the timeout is too tight)."""
        if self._extended is None:
            return
        stale, busy = self._extended
        self._extended = None
        log.info(
            "kit-launch: rank %d was silent %.2f s (timeout %.2f s) while rank(s) %s computed; it beat "
            "again: a slow step, not a hang",
            stale.rank,
            stale.stale_s,
            stale.timeout_s,
            ", ".join(map(str, busy)),
        )
        self.events.emit(
            "busy_extension",
            global_rank=stale.rank,
            stale_s=round(stale.stale_s, 4),
            timeout_s=round(stale.timeout_s, 4),
            busy_ranks=busy,
            phase=stale.phase,
            step=stale.step,
        )

    def _blame_hang(self, detected: Stale, now: float) -> tuple[Stale, list[Probe]]:
        """The rank that hung among the silent ones (its peers wait for it in a collective), with the probes.

        Every rank silent for at least half the detected allowance is asked where its main thread is."""
        silent = [s for s in self.monitor.silent(now) if s.stale_s >= detected.timeout_s / 2]
        probes = []
        for item in silent:
            pid = self.monitor.pid(item.rank)
            if pid is not None:
                probes.append(probe(self.stacks_dir, item.rank, pid))
        rank = culprit(probes, default=detected.rank)
        return next((s for s in silent if s.rank == rank), detected), probes


def describe_probes(probes: list[Probe]) -> str:
    """'; rank 1 is at faults.py:290 in _act, outside any collective; rank 0 waits in a collective (...)'."""
    words = {
        "stopped": "is stopped (SIGSTOP or a debugger)",
        "elsewhere": "is at {where}, outside any collective",
        "collective": "waits in a collective ({where})",
    }
    parts = [f"rank {p.rank} {words[p.state].format(where=p.where)}" for p in probes if p.state in words]
    return "".join(f"; {part}" for part in parts)
