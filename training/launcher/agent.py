"""The kit's elastic agent: torchelastic's LocalElasticAgent plus heartbeats, fatal exits and fast restarts.

It overrides three hooks and leaves the loop (rendezvous, restart budget, multi-node restarts) to
`SimpleElasticAgent._invoke_run` (reference/style.md §5):

- `_monitor_workers`: after the stock check, a worker that exited FATAL_CONFIG (78) spends the whole
  budget (never retried); a stale heartbeat makes the group UNHEALTHY, so the inherited restart path
  runs, unless a local rank's training thread or gloo thread is still busy on a CPU (`CpuActivity`): a
  slow, contended step, or its peers waiting for one, gets more time, up to the busy cap
  (`HeartbeatMonitor.busy_cap_s`); a hung rank and its peers waiting in a collective are idle, so a real
  hang is still found at the timeout (plus a tick).
  Each detection logs one line with its time to detection and emits an event.
- `_start_workers`: resets the heartbeat clocks, logs and emits the restart, then starts the group
  (through the zygote's shims when warm workers are on).
- `_shutdown`: a broken group (failed or hung) is SIGKILLed at once: a hung or SIGSTOPped rank never
  honours SIGTERM, and its peers are stuck in collectives anyway. So is a group with a rank outside the
  train loop (starting, loading, or restarting in process because a peer on another node died): SIGTERM
  asks a trainer to drain at its next step boundary, which such a rank never reaches. Otherwise (signal
  to the launcher, end of run, a new round while every rank trains) torchelastic's SIGTERM-then-wait.

A node that keeps failing by itself (`NodeFailures`: a local worker killed by a signal, or a hang whose
culprit is a local rank, not one waiting in a collective for a peer) is given up: the agent stops
retrying, says which node and why in one line and a `node_given_up` event, and the launcher exits without
closing the rendezvous, so a spare or the replacement pod takes its place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousError
from typing_extensions import override

from training.contracts import exitcodes
from training.launcher.activity import CpuActivity
from training.launcher.blame import ExitClock, Probe, culprit, probe
from training.launcher.monitor import HeartbeatMonitor, Stale
from training.launcher.rendezvous import KitRendezvous
from training.launcher.zygote import Zygote
from training.runtime import torch_internals as internals
from training.runtime.error_file import held_parse_failures, set_aside_if_torn
from training.runtime.events import EventLog
from training.runtime.hang_interrupt import INTERRUPT_SIGNAL
from training.runtime.heartbeat import HEARTBEAT_DIR_ENV

log = logging.getLogger("kit.launch")
BROKEN_GROUP_KILL_TIMEOUT_S = 10
WORKER_EXIT_NOTICE_S = 0.5
"""A stopped group's workers that take this long to exit are logged (under the zygote, see
`_await_zygote_workers`)."""
BUSY_WINDOW_TICKS = 2
"""A training thread is busy if it ran (or waited for a CPU) during the last this many monitor intervals."""
PEER_CHECK_SHARE = 0.5
"""A local rank silent for this share of its timeout makes the launcher read its ring neighbours' rendezvous
beats (`KitRendezvous.gone_neighbour`), at most once a beat."""


ExitState = Literal["running", "clean", "failed", "reaped"]


def _peek_exit(pid: int) -> ExitState:
    """A worker's state, read without reaping (WNOWAIT: torchelastic still collects the exit). Clean: 0, or
    DRAINED after a committed drain; reaped: torchelastic has already collected it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return "reaped"
    if info is None:
        return "running"
    clean = info.si_code == os.CLD_EXITED and info.si_status in (exitcodes.OK, exitcodes.DRAINED)
    return "clean" if clean else "failed"


def describe_exit(code: int) -> str:
    """'exit code 1' or 'signal SIGKILL (-9)'."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"signal {-code} ({code})"
    return f"exit code {code}"


class NodeFailures:
    """This node's own failures in a sliding window; `add` says when the node must be given up."""

    def __init__(self, *, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._times: deque[float] = deque()

    def add(self, now: float) -> int | None:
        """Record one failure; the count within the window when it reached the limit, else None."""
        self._times.append(now)
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()
        if self.limit and len(self._times) >= self.limit:
            return len(self._times)
        return None


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


class KitElasticAgent(LocalElasticAgent):
    """LocalElasticAgent with heartbeat hang detection, a never-retry exit code and SIGKILL restarts."""

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs,
        *,
        monitor: HeartbeatMonitor,
        events: EventLog,
        stacks_dir: str,
        shutdown_timeout: int = 30,
        node_failures: NodeFailures | None = None,
        node_name: str = "",
        rejoin_timeout_s: float | None = None,
        zygote: Zygote | None = None,
    ) -> None:
        super().__init__(
            spec=spec,
            logs_specs=logs_specs,
            start_method="spawn",
            **internals.agent_options(LocalElasticAgent, shutdown_timeout=shutdown_timeout),
        )
        self.monitor = monitor
        self.events = events
        self.stacks_dir = stacks_dir
        self.exits = ExitClock()
        self.fatal = False
        self.attempt = -1
        self.last_failure = ""
        self._broken = False
        self._pending_reason: str | None = None
        self._detected_at = 0.0
        self.node_failures = node_failures or NodeFailures(limit=0, window_s=1.0)
        self.node_name = node_name or socket.gethostname()
        self.rejoin_timeout_s = rejoin_timeout_s
        self.zygote = zygote
        self.given_up: str | None = None
        self.activity = CpuActivity(window_s=BUSY_WINDOW_TICKS * spec.monitor_interval)
        self._extended: tuple[Stale, list[int]] | None = None  # the silence given more time, who was busy
        self._interrupted: _Interrupted | None = None  # a hung rank interrupted in place, not yet beaten
        self._peer_checked_at = 0.0

    # --- hooks -------------------------------------------------------------------------------

    @override
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        states = self._worker_states()
        self._kill_peers_of_a_failed_worker(states)
        result = self._stock_monitor(worker_group, states)
        if result.state == WorkerState.FAILED:
            return self._on_failed(worker_group, result)
        if result.state != WorkerState.HEALTHY:
            return result
        now = time.time()
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
        self._mark_broken(f"node {node} is gone")
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
        log.warning("kit-launch: hang detected: %s%s%s", reason, _describe_probes(probes), then)
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
            self._count_own_failure(now, f"hang of rank {stale.rank}")
        self._mark_broken(f"hang of rank {stale.rank}")

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

    @override
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.attempt += 1
        if self.attempt > 0:
            reason = self._pending_reason or "another node restarted (rendezvous)"
            since = (
                f" {time.time() - self._detected_at:.2f} s after detection" if self._pending_reason else ""
            )
            log.warning(
                "kit-launch: restart %d: starting the worker group again%s (%s; %d/%d restarts left)",
                self.attempt,
                since,
                reason,
                internals.remaining_restarts(self),
                worker_group.spec.max_restarts,
            )
            self.events.emit(
                "restart", attempt=self.attempt, reason=reason, remaining=internals.remaining_restarts(self)
            )
        self._pending_reason = None
        self._broken = False
        self._extended = None
        self._interrupted = None
        self.activity.forget()
        # the workers' env is the launcher's, copied at spawn (and sent on by the shim under the zygote)
        os.environ[HEARTBEAT_DIR_ENV] = str(self.monitor.reset([w.global_rank for w in worker_group.workers]))
        pids = super()._start_workers(worker_group)
        self.events.emit(
            "group_started", attempt=self.attempt, ranks=[w.global_rank for w in worker_group.workers]
        )
        self.exits.watch(list(pids.values()))
        return pids

    @override
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        if self._broken:
            death_sig, timeout = signal.SIGKILL, BROKEN_GROUP_KILL_TIMEOUT_S
        elif death_sig == signal.SIGTERM and (outside := self._ranks_outside_the_loop()):
            # SIGTERM asks a trainer to drain at its next step boundary; a rank that is starting, loading or
            # restarting in process (its peer on another node died) has none to reach, and would hold the
            # new round for the whole timeout (30 s, measured) before torchelastic's SIGKILL.
            log.warning(
                "kit-launch: stopping the worker group: rank(s) %s outside the train loop (starting, loading "
                "or restarting in process), nothing to drain: SIGKILL",
                ", ".join(map(str, outside)),
            )
            death_sig, timeout = signal.SIGKILL, BROKEN_GROUP_KILL_TIMEOUT_S
        internals.shutdown(super()._shutdown, death_sig, timeout)
        self._await_zygote_workers()

    def _await_zygote_workers(self) -> None:
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

    # --- helpers -----------------------------------------------------------------------------

    def _worker_states(self) -> dict[int, tuple[int, ExitState]]:
        """Local rank -> (pid, `_peek_exit`) of every process the agent started (shims under the zygote)."""
        pcontext = internals.worker_processes(self)
        pids = {} if pcontext is None else pcontext.pids()
        return {local_rank: (pid, _peek_exit(pid)) for local_rank, pid in pids.items()}

    def _kill_peers_of_a_failed_worker(self, states: dict[int, tuple[int, ExitState]]) -> None:
        """A worker exited with an error: SIGKILL its live peers now, before torchelastic sees it.

        torchelastic answers a failure by SIGTERMing the other workers and waiting up to 30 s for them; a
        trainer takes SIGTERM as a drain request (it runs on to the next step boundary, which a broken
        collective never reaches), so every failure would cost 30 s."""
        if any(state == "failed" for _, state in states.values()):
            for pid in (pid for pid, state in states.values() if state == "running"):
                with contextlib.suppress(ProcessLookupError):  # a shim's worker dies with it (the zygote
                    os.kill(pid, signal.SIGKILL)  # kills the group of a lost shim)

    def _stock_monitor(
        self, worker_group: WorkerGroup, states: dict[int, tuple[int, ExitState]]
    ) -> RunResult:
        """torchelastic's check, safe from torn error files.

        torch's reader raises on a failed worker's error file that is not whole JSON (a trainer of one's
        own stopped while writing it), which would crash the launcher. Such files of exited workers are
        moved aside first, and again if torch raised on one that appeared meanwhile (a peer that exited
        while torch was stopping the group; the traceback torch logs before raising is held and dropped);
        the failure is then reported by its exit code."""
        self._set_aside_torn_error_files(states)
        while True:
            with held_parse_failures() as torch_tracebacks:
                try:
                    return super()._monitor_workers(worker_group)
                except (ValueError, KeyError, TypeError):  # what json.load and torch's field reads raise
                    if not self._set_aside_torn_error_files():
                        raise
                    torch_tracebacks.drop()  # our line says it

    def _set_aside_torn_error_files(self, states: dict[int, tuple[int, ExitState]] | None = None) -> bool:
        """Move aside the torn error files of workers that are no longer running (per `states`, read now
        when not given); True if one was."""
        pcontext = internals.worker_processes(self)
        error_files: dict[int, str] = {} if pcontext is None else pcontext.error_files
        states = self._worker_states() if states is None else states
        moved = False
        for local_rank, path in sorted(error_files.items()):
            if local_rank in states and states[local_rank][1] == "running":
                continue  # it may still be writing the file
            where = set_aside_if_torn(path)
            if where is not None:
                moved = True
                log.warning(
                    "kit-launch: local rank %d left an error file that is not whole JSON (stopped while "
                    "writing it?); %s; its failure is reported by its exit code",
                    local_rank,
                    where,
                )
        return moved

    def _on_failed(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
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
            internals.spend_restarts(self)  # the inherited loop stops instead of retrying
            log.error(
                "kit-launch: a worker exited %d (fatal config): not retrying; fix the config and resubmit",
                exitcodes.FATAL_CONFIG,
            )
        if first.exitcode < 0 and not self.fatal:  # the first exit: its peers then die of it (or are killed)
            self._count_own_failure(time.time(), f"rank {first_rank} {describe_exit(first.exitcode)}")
        self._mark_broken(self.last_failure)
        return result

    def _count_own_failure(self, now: float, reason: str) -> None:
        """One failure of this node's own; past the limit the node is given up (no restart left)."""
        count = self.node_failures.add(now)
        if count is None or self.given_up is not None:
            return
        self.given_up = (
            f"node {self.node_name} failed {count} times in {self.node_failures.window_s:g} s "
            f"(last: {reason})"
        )
        internals.spend_restarts(self)
        log.error(
            "kit-launch: giving up node %s: %s; a spare or the Job's replacement pod takes its place "
            "(on EKS, node auto-repair replaces the instance)",
            self.node_name,
            self.given_up,
        )
        self.events.emit(
            "node_given_up",
            node=self.node_name,
            failures=count,
            window_s=self.node_failures.window_s,
            reason=reason,
        )

    def _mark_broken(self, reason: str) -> None:
        self._broken = True
        self._pending_reason = reason
        self._detected_at = time.time()
        if reason.startswith("hang"):
            self.last_failure = reason
        if self.rejoin_timeout_s is not None and internals.remaining_restarts(self) > 0:
            log.warning(
                "kit-launch: the group re-forms: waiting up to %g s for every node (a spare, the lost "
                "node's replacement pod or the same nodes) before giving up (rendezvous join_timeout)",
                self.rejoin_timeout_s,
            )


def _describe_probes(probes: list[Probe]) -> str:
    """'; rank 1 is at faults.py:290 in _act, outside any collective; rank 0 waits in a collective (...)'."""
    words = {
        "stopped": "is stopped (SIGSTOP or a debugger)",
        "elsewhere": "is at {where}, outside any collective",
        "collective": "waits in a collective ({where})",
    }
    parts = [f"rank {p.rank} {words[p.state].format(where=p.where)}" for p in probes if p.state in words]
    return "".join(f"; {part}" for part in parts)
