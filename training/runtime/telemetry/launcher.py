"""The launcher's live metrics: faults it detects, restarts, its restart budget, whether this node waits as a
spare, and how long ago its workers last finished a step. Every node's launcher publishes its own view; the
catalog's statistics (Maximum, Minimum) make one job-level series of them. The launcher outlives its workers,
so "no progress" is measured here: a job stuck in restarts or waiting for a node still reports it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.metrics_settings import MetricsSettings
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.telemetry.source import MetricSource

FAULT_CLASS_OF = {"hang_detected": "silent", "node_given_up": "bad_node"}
"""Launcher events -> failure class; `worker_failed` is "hard" for the rank that failed first only."""


class LauncherMetrics(MetricSource):
    """Fed every launcher event (`EventLog.observe`); publishes counts as they happen, gauges each period."""

    def __init__(self, *, max_restarts: int, spares: int) -> None:
        self._restarts_left = max_restarts
        self._spares = spares
        self.last_step_ts: Callable[[], float | None] = lambda: None
        """When this node's workers last finished a step; the agent's heartbeat monitor once it exists."""
        self._started = time.time()
        self._waiting = False

    @classmethod
    def start(
        cls,
        settings: MetricsSettings,
        events: EventLog,
        *,
        run_dir: str | None,
        node_rank: int,
        max_restarts: int,
        spares: int,
    ) -> LauncherMetrics | None:
        """Publish this launcher's events and gauges; None when the sink is off."""
        metrics = cls(max_restarts=max_restarts, spares=spares)
        properties = {"role": "launcher", "node_rank": node_rank}
        who = f"launcher-node{node_rank}"
        return (
            metrics
            if metrics.attach(settings, events, run_dir=run_dir, who=who, properties=properties)
            else None
        )

    def observe(self, record: Mapping[str, Any]) -> None:
        kind, ts = record["kind"], record["ts"]
        if kind == "worker_failed" and record.get("first"):
            self._put({catalog.FAULTS.name: 1.0}, ts, fault_class="hard")
        elif kind in FAULT_CLASS_OF:
            self._put({catalog.FAULTS.name: 1.0}, ts, fault_class=FAULT_CLASS_OF[kind])
        elif kind == "restart":
            if isinstance(record.get("remaining"), int):
                self._restarts_left = record["remaining"]
            left = float(self._restarts_left)
            self._put({catalog.RESTARTS.name: 1.0, catalog.RESTARTS_LEFT.name: left}, ts)
        elif kind == "spare_waiting":
            self._waiting = True
        elif kind == "group_started":
            self._waiting = False

    def gauges(self) -> dict[str, float]:
        values = {catalog.RESTARTS_LEFT.name: float(self._restarts_left)}
        if not self._waiting:  # a spare waits by design: its silence is not a stuck job
            since = time.time() - (self.last_step_ts() or self._started)
            values[catalog.SECONDS_SINCE_STEP.name] = since
        if self._spares > 0:
            values[catalog.SPARES_WAITING.name] = 1.0 if self._waiting else 0.0
        return values
