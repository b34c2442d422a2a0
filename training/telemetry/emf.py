"""EMF records (CloudWatch Embedded Metric Format) off the caller's thread, to a file or the CloudWatch agent.

The format is aws-embedded-metrics' own (`MetricsContext` + `LogSerializer`: the documented `_aws` metadata,
its limits of 100 metrics and 30 dimensions per record, its name and unit checks); the library's loggers and
sinks are not used: they flush through asyncio, and a training step must never wait for a socket. Here a
bounded queue takes each record and one daemon thread writes it; when the agent cannot be reached the records
are dropped (counted, said once on stderr), never queued without bound and never retried in the loop.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from aws_embedded_metrics.logger.metrics_context import MetricsContext
from aws_embedded_metrics.serializers.log_serializer import LogSerializer

from training.telemetry import catalog
from training.telemetry.settings import MetricsSettings

METRICS_DIR = "metrics"
"""Run-folder subfolder of the `file` sink's records: one `<who>-<host>-<pid>.emf.jsonl` per process."""
QUEUE_RECORDS = 10_000
RECONNECT_S = 5.0

Gauges = Callable[[], Mapping[str, float]]
_Item = tuple[dict[str, float], float, str | None]


def format_record(
    settings: MetricsSettings,
    values: Mapping[str, float],
    *,
    ts: float,
    fault_class: str | None = None,
    properties: Mapping[str, Any] | None = None,
) -> list[str]:
    """The EMF lines of one record: `values` (catalog names) at unix time `ts`, under the catalog's dimension
    sets (with FaultClass added to each when given); non-finite values are left out."""
    context = MetricsContext.empty()
    context.namespace = catalog.NAMESPACE
    base = {catalog.CLUSTER: settings.cluster, catalog.JOB: settings.job}
    sets = [{k: base[k] for k in keys} for keys in catalog.DIMENSION_SETS]
    if fault_class is not None:
        sets = [{**s, catalog.FAULT_CLASS: fault_class} for s in sets]
    context.set_dimensions(sets)
    for name, value in values.items():
        spec = catalog.BY_NAME[name]  # a name outside the catalog is a bug here, not input
        if value is not None and math.isfinite(value):
            context.put_metric(name, float(value), spec.unit)
    if not context.metrics:
        return []
    for key, value in (properties or {}).items():
        context.set_property(key, value)
    context.meta["Timestamp"] = int(ts * 1000)
    if settings.sink == "agent":
        context.meta["LogGroupName"] = settings.log_group
    return LogSerializer.serialize(context)


class _AgentSocket:
    """Lines to the agent's EMF listener; reconnects at most every RECONNECT_S, drops while it cannot."""

    def __init__(self, settings: MetricsSettings) -> None:
        self.scheme, self.host, self.port = settings.host_port
        self._sock: socket.socket | None = None
        self._next_try = 0.0
        self.dropped = 0
        self._said = False

    def send(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        try:
            if self.scheme == "udp":
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._sock.sendto(data, (self.host, self.port))
                return
            if self._sock is None:
                if time.monotonic() < self._next_try:
                    self.dropped += 1
                    return
                self._next_try = time.monotonic() + RECONNECT_S
                self._sock = socket.create_connection((self.host, self.port), timeout=2.0)
            self._sock.sendall(data)
        except OSError as exc:
            self.dropped += 1
            self.close()
            if not self._said:
                self._said = True
                print(
                    f"[metrics] the CloudWatch agent at {self.scheme}://{self.host}:{self.port} cannot be "
                    f"reached ({exc}); metric records are dropped until it can",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class EmfPublisher:
    """One process's metric records: `put` from any thread returns at once; `gauges`, when given, is called
    every `settings.period_s` on the publisher's thread and its values published as one record."""

    def __init__(
        self,
        settings: MetricsSettings,
        *,
        run_dir: str | os.PathLike[str] | None,
        who: str,
        properties: Mapping[str, Any],
        gauges: Gauges | None = None,
    ) -> None:
        self.settings = settings
        self._properties = dict(properties)
        self._gauges = gauges
        self._queue: queue.Queue[_Item | None] = queue.Queue(QUEUE_RECORDS)
        self._file: TextIO | None = None
        self._agent: _AgentSocket | None = None
        if settings.sink == "file" and run_dir is not None:
            folder = Path(run_dir) / METRICS_DIR
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{who}-{socket.gethostname()}-{os.getpid()}.emf.jsonl"
            self._file = open(folder / name, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        elif settings.sink == "agent":
            self._agent = _AgentSocket(settings)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="kit-metrics", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return self._file is not None or self._agent is not None

    def put(
        self, values: Mapping[str, float], *, ts: float | None = None, fault_class: str | None = None
    ) -> None:
        """Queue one record; a full queue drops it (the agent is far behind: the loop never waits for it)."""
        if not self.active:
            return
        try:
            self._queue.put_nowait((dict(values), ts or time.time(), fault_class))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish a last gauge record and what is queued, then stop (bounded by `timeout_s`)."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        next_tick = time.monotonic() + self.settings.period_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                item = ...
            if item is None or item is ...:
                self._tick()
                next_tick = time.monotonic() + self.settings.period_s
                if item is None:
                    break
                continue
            values, ts, fault_class = item
            self._write(values, ts, fault_class)
        if self._file is not None:
            self._file.close()
        if self._agent is not None:
            self._agent.close()

    def _tick(self) -> None:
        if self._gauges is None:
            return
        try:
            values = dict(self._gauges())
        except Exception as exc:  # a gauge must never end the process it watches
            print(f"[metrics] gauges failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return
        self._write(values, time.time(), None)

    def _write(self, values: dict[str, float], ts: float, fault_class: str | None) -> None:
        props = self._properties
        for line in format_record(self.settings, values, ts=ts, fault_class=fault_class, properties=props):
            if self._file is not None:
                self._file.write(line + "\n")
            elif self._agent is not None:
                self._agent.send(line)
