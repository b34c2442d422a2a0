"""Where a process sends its live metrics: read once from the pod's environment, which `make train-job`
and the local runner render from the job values, so the launcher and the trainer of a pod always agree.

    KIT_METRICS             off | file (default: <run dir>/metrics/, for local runs and the report) |
                            agent (the CloudWatch agent's EMF listener, on EKS)
    AWS_EMF_AGENT_ENDPOINT  tcp://HOST:PORT or udp://HOST:PORT of that listener (the aws-embedded-metrics
                            library's own variable); default the observability add-on's Service
    KIT_CLUSTER_NAME        the ClusterName dimension (default "local")
    KIT_JOB_NAME            the JobName dimension (default the run id)
    KIT_METRICS_LOG_GROUP   the log group the agent writes the records to (the stacks create it)
    KIT_METRICS_PERIOD_S    seconds between gauge records (default 30; 1 to 300)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

SINK_ENV = "KIT_METRICS"
ENDPOINT_ENV = "AWS_EMF_AGENT_ENDPOINT"
CLUSTER_ENV = "KIT_CLUSTER_NAME"
JOB_ENV = "KIT_JOB_NAME"
LOG_GROUP_ENV = "KIT_METRICS_LOG_GROUP"
PERIOD_ENV = "KIT_METRICS_PERIOD_S"
DEFAULT_ENDPOINT = "tcp://cloudwatch-agent.amazon-cloudwatch:25888"
"""The Service the amazon-cloudwatch-observability add-on's operator creates for its agent; it opens the EMF
port 25888 when the agent's config has `logs.metrics_collected.emf` (infra/constructs/addons.py sets it)."""
Sink = Literal["off", "file", "agent"]
SINKS: tuple[str, ...] = ("off", "file", "agent")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_LOG_GROUP = re.compile(r"^[A-Za-z0-9_./#-]{1,512}$")


class MetricsSettingsError(ValueError):
    """A metrics setting that cannot be used; one line naming the variable and what to give."""


def log_group_name(cluster: str) -> str:
    """The log group of a cluster's metric records (the stacks create it with a retention)."""
    return f"/kit/{cluster}/training-metrics"


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    sink: Sink = "file"
    endpoint: str = DEFAULT_ENDPOINT
    cluster: str = "local"
    job: str = ""
    log_group: str = ""
    period_s: float = 30.0

    @property
    def host_port(self) -> tuple[str, str, int]:
        """(scheme, host, port) of the agent endpoint (checked in `from_env`)."""
        parts = urlsplit(self.endpoint)
        return parts.scheme, parts.hostname or "", int(parts.port or 0)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, run_id: str) -> MetricsSettings:
        """The settings in `env`, checked; `run_id` is the JobName when KIT_JOB_NAME is not set."""
        sink = env.get(SINK_ENV, "file").strip().lower()
        if sink not in SINKS:  # "" included: a variable set to nothing says nothing
            raise MetricsSettingsError(
                f"{SINK_ENV}={env[SINK_ENV]!r} is not a metrics sink; use off, file or agent"
            )
        endpoint = env.get(ENDPOINT_ENV, "").strip() or DEFAULT_ENDPOINT
        try:
            parts = urlsplit(endpoint)
            port = parts.port
        except ValueError:
            port, parts = None, urlsplit("")
        if parts.scheme not in ("tcp", "udp") or not parts.hostname or not port:
            raise MetricsSettingsError(
                f"{ENDPOINT_ENV}={endpoint!r} is not an agent endpoint; use tcp://HOST:PORT or udp://HOST:PORT"
            )
        cluster = env.get(CLUSTER_ENV, "").strip() or "local"
        job = env.get(JOB_ENV, "").strip() or run_id
        for var, value in ((CLUSTER_ENV, cluster), (JOB_ENV, job)):
            if not _NAME.match(value):
                raise MetricsSettingsError(
                    f"{var}={value!r} is not a dimension value; use 1-128 letters, digits and . _ / -"
                )
        log_group = env.get(LOG_GROUP_ENV, "").strip() or log_group_name(cluster)
        if not _LOG_GROUP.match(log_group):
            raise MetricsSettingsError(f"{LOG_GROUP_ENV}={log_group!r} is not a log group name")
        raw = env.get(PERIOD_ENV, "").strip() or "30"
        try:
            period = float(raw)
        except ValueError:
            period = math.nan
        if not (math.isfinite(period) and 1.0 <= period <= 300.0):
            raise MetricsSettingsError(f"{PERIOD_ENV}={raw!r} is not a period; use seconds from 1 to 300")
        return cls(
            sink=sink,  # type: ignore[arg-type]
            endpoint=endpoint,
            cluster=cluster,
            job=job,
            log_group=log_group,
            period_s=period,
        )
