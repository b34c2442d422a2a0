"""What the trainer's and the launcher's live metrics share: fed a process's events, publishing through one
EmfPublisher (values as they happen, gauges each period)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdpkit.contracts.metrics_settings import MetricsSettings
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.telemetry.emf import EmfPublisher


class MetricSource:
    """Subclasses turn events into values (`observe`) and say their gauges (`gauges`)."""

    publisher: EmfPublisher | None = None

    @staticmethod
    def publishes(settings: MetricsSettings, run_dir: str | Path | None) -> bool:
        """Whether records go anywhere: not with the sink off, nor to a file without a run folder."""
        return not (settings.sink == "off" or (settings.sink == "file" and run_dir is None))

    def observe(self, record: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def gauges(self) -> dict[str, float]:
        return {}

    def attach(
        self,
        settings: MetricsSettings,
        events: EventLog,
        *,
        run_dir: str | Path | None,
        who: str,
        properties: Mapping[str, Any],
    ) -> bool:
        """Publish from now on; False (nothing started) when the sink is off or has nowhere to write."""
        if not self.publishes(settings, run_dir):
            return False
        properties = {**properties, "pod": os.environ.get("POD_NAME", "")}
        self.publisher = EmfPublisher(
            settings, run_dir=run_dir, who=who, properties=properties, gauges=self.gauges
        )
        events.observe(self.observe)
        return True

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def _put(self, values: dict[str, float], ts: float, *, fault_class: str | None = None) -> None:
        if self.publisher is not None:
            self.publisher.put(values, ts=ts, fault_class=fault_class)
