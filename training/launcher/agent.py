"""The kit's elastic agent: torchelastic's LocalElasticAgent plus heartbeats, fatal exits and fast restarts.

It overrides three hooks and leaves the loop (rendezvous, restart budget, multi-node restarts) to
`SimpleElasticAgent._invoke_run` (reference/style.md §5); each hook calls torch's own and hands the kit's
part to a collaborator:

- `_monitor_workers`: a failed worker's peers are SIGKILLed before the stock check (`WorkerExits`); a
  failure is logged and counted (`FailureRecord`: a worker that exited FATAL_CONFIG (78) spends the whole
  budget); on a healthy group the heartbeat checks run (`HangWatch`: a stale heartbeat makes the group
  UNHEALTHY, so the inherited restart path runs). First, a rank's request to evict this node is acted on
  (`NodeActions`: the cordon and the drain are the launcher's, never a rank's).
- `_start_workers`: resets the heartbeat clocks, logs and emits the restart, then starts the group
  (through the zygote's shims when warm workers are on) (`GroupLifecycle`).
- `_shutdown`: a broken group, or one with a rank outside the train loop, is SIGKILLed at once; otherwise
  torchelastic's SIGTERM-then-wait (`GroupLifecycle`).

A node that keeps failing by itself is given up (`OwnFailures`): the agent stops retrying and the launcher
exits without closing the rendezvous, so a spare or the replacement pod takes its place.
"""

from __future__ import annotations

import functools
import signal
import socket
import time
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs
from typing_extensions import override

from fsdpkit.launcher.activity import CpuActivity
from fsdpkit.launcher.budget import AgentBudget
from fsdpkit.launcher.exits import WorkerExits
from fsdpkit.launcher.failures import FailureRecord
from fsdpkit.launcher.hang import BUSY_WINDOW_TICKS, HangWatch
from fsdpkit.launcher.lifecycle import GroupLifecycle
from fsdpkit.launcher.monitor import HeartbeatMonitor
from fsdpkit.launcher.node_actions import NodeActions
from fsdpkit.launcher.node_failures import NodeFailures, OwnFailures
from fsdpkit.launcher.zygote import Zygote
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.events import EventLog


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
        activity: CpuActivity | None = None,
        node_actions: NodeActions | None = None,
    ) -> None:
        super().__init__(
            spec=spec,
            logs_specs=logs_specs,
            start_method="spawn",
            **internals.agent_options(LocalElasticAgent, shutdown_timeout=shutdown_timeout),
        )
        budget = AgentBudget(self)
        self.exits = WorkerExits(functools.partial(internals.worker_processes, self))
        self.own_failures = OwnFailures(
            node_failures or NodeFailures(limit=0, window_s=1.0),
            node_name=node_name or socket.gethostname(),
            events=events,
            budget=budget,
        )
        self.failures = FailureRecord(
            monitor=monitor,
            events=events,
            exits=self.exits,
            own_failures=self.own_failures,
            budget=budget,
            rejoin_timeout_s=rejoin_timeout_s,
        )
        if activity is None:
            activity = CpuActivity(window_s=BUSY_WINDOW_TICKS * spec.monitor_interval)
        self.hangs = HangWatch(
            monitor=monitor,
            events=events,
            stacks_dir=stacks_dir,
            failures=self.failures,
            own_failures=self.own_failures,
            activity=activity,
        )
        self.node_actions = node_actions
        """Acts on its node when a rank asks (a straggler's cordon and drain); None: the requests wait."""
        self.lifecycle = GroupLifecycle(
            monitor=monitor, events=events, exits=self.exits, budget=budget, zygote=zygote
        )

    # --- what the launcher's exit reads ------------------------------------------------------------

    @property
    def attempt(self) -> int:
        return self.lifecycle.attempt

    @property
    def given_up(self) -> str | None:
        return self.own_failures.given_up

    @property
    def fatal(self) -> bool:
        return self.failures.fatal

    @property
    def last_failure(self) -> str:
        return self.failures.last_failure

    # --- hooks -------------------------------------------------------------------------------------

    @override
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        if self.node_actions is not None:
            self.node_actions.poll()
        states = self.exits.states()
        self.exits.kill_peers_of_a_failed_worker(states)
        result = self.exits.stock_check(functools.partial(super()._monitor_workers, worker_group), states)
        if result.state == WorkerState.FAILED:
            return self.failures.workers_failed(worker_group, result)
        if result.state != WorkerState.HEALTHY:
            return result
        return self.hangs.check(worker_group, result, time.time())

    @override
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.lifecycle.starting(worker_group, self.failures.take_pending())
        self.hangs.forget()
        pids = super()._start_workers(worker_group)
        self.lifecycle.started(worker_group, pids)
        return pids

    @override
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        death_sig, timeout = self.lifecycle.stop_signal(death_sig, timeout, broken=self.failures.broken)
        internals.shutdown(super()._shutdown, death_sig, timeout)
        self.lifecycle.await_zygote_workers()
