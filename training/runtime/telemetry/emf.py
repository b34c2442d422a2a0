"""EMF records (CloudWatch Embedded Metric Format) off the caller's thread, to a file or the CloudWatch agent.

The records follow the format's specification (`_aws` metadata with Timestamp, CloudWatchMetrics directives:
namespace, dimension sets, metric names and units; the values and dimensions at the root), written here in a
few lines rather than through `aws-embedded-metrics`: that library's package imports asyncio and its
environment detection at import (8.7 MB more in every trainer rank and launcher, measured) and flushes through
asyncio, while every name, unit and dimension here comes from the catalog, which the tests read back with a
reader written from the specification. A bounded queue takes each record and one daemon thread writes it;
when the agent cannot be reached the records are dropped (counted, said once on stderr), never queued
without bound and never retried in the loop.
"""

from __future__ import annotations

import contextlib
import json
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

from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.metrics_settings import MetricsSettings
from fsdpkit.contracts.run_layout import METRICS_DIR

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
    """The EMF line of one record: `values` (catalog names) at unix time `ts`, under the catalog's dimension
    sets (with FaultClass added to each when given); non-finite values are left out, and a record left with
    none is not written. A list: one line today (the catalog has far fewer than the format's 100 metrics)."""
    metrics = {name: float(v) for name, v in values.items() if v is not None and math.isfinite(v)}
    for name in values:
        catalog.BY_NAME[name]  # a name outside the catalog is a bug here, not input
    if not metrics:
        return []
    root: dict[str, Any] = {catalog.CLUSTER: settings.cluster, catalog.JOB: settings.job}
    sets = [list(keys) for keys in catalog.DIMENSION_SETS]
    if fault_class is not None:
        root[catalog.FAULT_CLASS] = fault_class
        sets = [[*keys, catalog.FAULT_CLASS] for keys in sets]
    meta: dict[str, Any] = {
        "Timestamp": int(ts * 1000),
        "CloudWatchMetrics": [
            {
                "Namespace": catalog.NAMESPACE,
                "Dimensions": sets,
                "Metrics": [{"Name": n, "Unit": catalog.BY_NAME[n].unit} for n in metrics],
            }
        ],
    }
    if settings.sink == "agent":
        meta["LogGroupName"] = settings.log_group
    record = {**dict(properties or {}), **root, **metrics, "_aws": meta}
    return [json.dumps(record, separators=(",", ":"))]


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
