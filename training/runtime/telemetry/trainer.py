"""Rank 0's live metrics, from the events it writes: per step (step, step time, tokens/s, MFU, recovery
after a restart), per save (stall), per soft fault or drain, and each period the gauges (goodput so far,
checkpoint age, world size). Ranks step together through collectives, so rank 0's view is the job's, as
in the report."""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.metrics_settings import MetricsSettings
from fsdpkit.runtime.events import EventLog, events_dir
from fsdpkit.runtime.telemetry.source import MetricSource

RECENT_STEPS = 200
"""Step durations the median (goodput, checkpoint interval in seconds) is taken over."""


def run_started_at(run_dir: str | Path | None, fallback: float) -> float:
    """Unix time of the run's first trainer start: the first line of rank 0's oldest event file (every restart
    of the run writes a new one), `fallback` when there is none yet."""
    if run_dir is None:
        return fallback
    first = fallback
    for path in events_dir(run_dir).glob("trainer-rank0-*.jsonl"):
        try:
            with open(path, encoding="utf-8") as fh:
                first = min(first, float(json.loads(fh.readline())["ts"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return first


class TrainerMetrics(MetricSource):
    """Fed rank 0's events (`EventLog.observe`); publishes as they happen and gauges each period."""

    def __init__(
        self, *, run_dir: str | Path | None, interval_steps: int | None, checkpoints: bool = True
    ) -> None:
        self._process_start = psutil.Process().create_time()
        self._run_start = run_started_at(run_dir, self._process_start)
        self._interval_steps = interval_steps
        self._checkpoints = checkpoints
        """False when checkpoints are off: no checkpoint age then (it would only grow)."""
        self._durations: deque[float] = deque(maxlen=RECENT_STEPS)
        self._step: int | None = None
        self._world: int | None = None
        self._last_commit: float | None = None
        self._restart_started: float | None = None

    @classmethod
    def start(
        cls,
        settings: MetricsSettings,
        events: EventLog,
        *,
        run_dir: Path | None,
        interval_steps: int | None,
        checkpoints: bool,
    ) -> TrainerMetrics | None:
        """Publish rank 0's events and gauges; None when the sink is off (and nothing is read)."""
        if not cls.publishes(settings, run_dir):
            return None
        metrics = cls(run_dir=run_dir, interval_steps=interval_steps, checkpoints=checkpoints)
        properties = {"role": "trainer", "rank": 0}
        attached = metrics.attach(
            settings, events, run_dir=run_dir, who="trainer-rank0", properties=properties
        )
        return metrics if attached else None

    def observe(self, record: Mapping[str, Any]) -> None:
        kind, ts = record["kind"], record["ts"]
        if kind == "start":
            self._world = record.get("world_size")
        elif kind == "resume" and record.get("step") is not None:
            self._restart_started = self._process_start  # a restarted worker: recovery ends at its first step
            self._last_commit = ts  # the live state is the checkpoint's again: nothing is at risk yet
        elif kind == "inprocess_restart":
            self._restart_started = ts - float(record.get("duration_s") or 0.0)
            self._put({catalog.INPROCESS_RESTARTS.name: 1.0}, ts)
        elif kind == "drained":
            self._put({catalog.FAULTS.name: 1.0}, ts, fault_class="drain")
        elif kind == "interval" and isinstance(record.get("interval"), int):
            self._interval_steps = record["interval"]
        elif kind == "ckpt" and record.get("phase") == "stall":
            self._put({catalog.CHECKPOINT_STALL.name: float(record["duration_s"])}, ts)
        elif kind == "ckpt" and record.get("phase") == "commit":
            self._last_commit = ts - float(record.get("duration_s") or 0.0)  # the saved step's own time
        elif kind == "step":
            self._on_step(record, ts)

    def _on_step(self, record: Mapping[str, Any], ts: float) -> None:
        self._step = int(record["step"])
        duration = float(record["duration_s"])
        self._durations.append(duration)
        values = {catalog.STEP.name: float(self._step), catalog.STEP_TIME.name: duration}
        if record.get("tokens_per_s") is not None:
            values[catalog.TOKENS_PER_S.name] = float(record["tokens_per_s"])
        if record.get("mfu") is not None:
            values[catalog.MFU.name] = 100.0 * float(record["mfu"])
        if self._restart_started is not None:
            values[catalog.RECOVERY.name] = ts - self._restart_started
            self._restart_started = None
        self._put(values, ts)

    def gauges(self) -> dict[str, float]:
        now = time.time()
        values: dict[str, float] = {}
        if self._world is not None:
            values[catalog.WORLD_SIZE.name] = float(self._world)
        age = now - (self._last_commit if self._last_commit is not None else self._run_start)
        if self._checkpoints:
            values[catalog.CHECKPOINT_AGE.name] = age
        if self._durations:
            median = statistics.median(self._durations)
            if self._step is not None and now > self._run_start:
                ratio = self._step * median / (now - self._run_start)
                values[catalog.GOODPUT.name] = min(100.0, 100.0 * ratio)
            if self._checkpoints and self._interval_steps and median > 0:
                values[catalog.CHECKPOINT_AGE_INTERVALS.name] = age / (self._interval_steps * median)
        return values
