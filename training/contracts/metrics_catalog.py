"""Every live metric the kit emits, named once: the trainer and launcher emit these, the stacks' dashboard and
alarms (infra/constructs/monitoring.py) read them, so a rename cannot break an alarm silently.

Dimensions stay few (CloudWatch bills and limits per dimension combination): every metric is emitted
under (ClusterName, JobName) and under (ClusterName) alone, so a cluster's alarms watch one series whatever
jobs run; `Faults` adds FaultClass. The pod, node and rank go into each record as properties (searchable
with Logs Insights), never as dimensions. Standard library only: the infra side imports this without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NAMESPACE = "FsdpKit/Training"
"""CloudWatch namespace of every kit metric."""
CLUSTER = "ClusterName"
JOB = "JobName"
FAULT_CLASS = "FaultClass"
DIMENSION_SETS: tuple[tuple[str, ...], ...] = ((CLUSTER, JOB), (CLUSTER,))
"""Each record is published under both sets: per job (dashboard) and per cluster (alarms)."""

Unit = Literal["Seconds", "Count", "Count/Second", "Percent", "None"]
Emitter = Literal["trainer", "launcher"]
Statistic = Literal["Average", "Maximum", "Minimum", "Sum"]


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    name: str
    unit: Unit
    emitter: Emitter
    """trainer: rank 0 only (ranks step together; one rank's view is the job's); launcher: every node."""
    statistic: Statistic
    """How a period's values combine on the dashboard and in alarms."""
    when: str
    """When a value is emitted."""
    meaning: str


STEP = MetricSpec(
    name="Step", unit="None", emitter="trainer", statistic="Maximum", when="every step",
    meaning="the training step just completed",
)  # fmt: skip
STEP_TIME = MetricSpec(
    name="StepTime", unit="Seconds", emitter="trainer", statistic="Average", when="every step",
    meaning="wall time of the step on rank 0",
)  # fmt: skip
TOKENS_PER_S = MetricSpec(
    name="TokensPerSecond", unit="Count/Second", emitter="trainer", statistic="Average", when="every step",
    meaning="tokens per second per GPU",
)  # fmt: skip
MFU = MetricSpec(
    name="MFU", unit="Percent", emitter="trainer", statistic="Average", when="every step, on a known GPU",
    meaning="model FLOPs utilisation (training/contracts/throughput.py)",
)  # fmt: skip
GOODPUT = MetricSpec(
    name="Goodput", unit="Percent", emitter="trainer", statistic="Minimum", when="every period",
    meaning="strict goodput so far: steps x median step / wall since the run's first start (the report's)",
)  # fmt: skip
CHECKPOINT_STALL = MetricSpec(
    name="CheckpointStall", unit="Seconds", emitter="trainer", statistic="Sum", when="every save",
    meaning="seconds the training loop was blocked by a save",
)  # fmt: skip
CHECKPOINT_AGE = MetricSpec(
    name="CheckpointAge", unit="Seconds", emitter="trainer", statistic="Maximum", when="every period",
    meaning="seconds since the last committed checkpoint (since the start while none is)",
)  # fmt: skip
CHECKPOINT_AGE_INTERVALS = MetricSpec(
    name="CheckpointAgeIntervals", unit="None", emitter="trainer", statistic="Maximum", when="every period",
    meaning="CheckpointAge / the checkpoint interval in seconds (interval steps x median step)",
)  # fmt: skip
RECOVERY = MetricSpec(
    name="RecoverySeconds", unit="Seconds", emitter="trainer", statistic="Maximum",
    when="the first step after a restart",
    meaning="from the start of a worker (or of an in-process restart) to the end of its first step",
)  # fmt: skip
WORLD_SIZE = MetricSpec(
    name="WorldSize", unit="Count", emitter="trainer", statistic="Maximum", when="every period",
    meaning="trainer ranks of the running job",
)  # fmt: skip
FAULTS = MetricSpec(
    name="Faults", unit="Count", emitter="launcher", statistic="Sum",
    when="each fault the launcher detects (the trainer: each drain)",
    meaning="faults by failure class (docs/runbook.md): hard, silent, bad_node, drain",
)  # fmt: skip
INPROCESS_RESTARTS = MetricSpec(
    name="InprocessRestarts", unit="Count", emitter="trainer", statistic="Sum",
    when="each in-process restart",
    meaning="restarts in place: soft faults (an exception) and hangs the launcher interrupted (also silent)",
)  # fmt: skip
RESTARTS = MetricSpec(
    name="Restarts", unit="Count", emitter="launcher", statistic="Sum", when="each worker group restart",
    meaning="worker group restarts by the launcher (restarts in place: InprocessRestarts)",
)  # fmt: skip
RESTARTS_LEFT = MetricSpec(
    name="RestartsLeft", unit="Count", emitter="launcher", statistic="Minimum", when="every period",
    meaning="the launcher's restart budget left (--max-restarts minus restarts so far)",
)  # fmt: skip
SECONDS_SINCE_STEP = MetricSpec(
    name="SecondsSinceStep", unit="Seconds", emitter="launcher", statistic="Maximum", when="every period",
    meaning="seconds since this node's workers last finished a step (since the launcher started, before any)",
)  # fmt: skip
SPARES_WAITING = MetricSpec(
    name="SparesWaiting", unit="Count", emitter="launcher", statistic="Maximum",
    when="every period, in a job with spares",
    meaning="1 from a hot spare waiting warm, 0 from a node that trains",
)  # fmt: skip

METRICS: tuple[MetricSpec, ...] = (
    STEP, STEP_TIME, TOKENS_PER_S, MFU, GOODPUT, CHECKPOINT_STALL, CHECKPOINT_AGE, CHECKPOINT_AGE_INTERVALS,
    RECOVERY, WORLD_SIZE, FAULTS, INPROCESS_RESTARTS, RESTARTS, RESTARTS_LEFT, SECONDS_SINCE_STEP,
    SPARES_WAITING,
)  # fmt: skip
BY_NAME = {m.name: m for m in METRICS}

FAULT_CLASSES: tuple[str, ...] = ("hard", "silent", "bad_node", "drain")
"""The failure classes of design.md that the process that sees them can name (rank 0 cannot tell a peer's
exception from any other lost peer, so soft faults are counted as InprocessRestarts)."""

DASHBOARD_ROWS: tuple[tuple[MetricSpec, ...], ...] = (
    (STEP, STEP_TIME, TOKENS_PER_S, MFU),
    (GOODPUT, CHECKPOINT_AGE, CHECKPOINT_STALL, RECOVERY),
    (FAULTS, INPROCESS_RESTARTS, RESTARTS, RESTARTS_LEFT),
    (SECONDS_SINCE_STEP, SPARES_WAITING, WORLD_SIZE, CHECKPOINT_AGE_INTERVALS),
)
"""The dashboard's graphs, four to a row: progress, time lost, faults, capacity; every metric once. The
stacks' dashboard and the local preview (fsdpkit.analysis.dashboard_preview) both lay it out from here."""

Comparison = Literal["GreaterThanThreshold", "LessThanThreshold", "LessThanOrEqualToThreshold"]


@dataclass(frozen=True, kw_only=True)
class AlarmThresholds:
    """What the alarms fire at; the stacks read them from `monitoring.*` in cdk.json (fsdpkit.infra.config),
    where they are checked, with these defaults."""

    no_progress_minutes: int = 10
    stale_checkpoint_intervals: int = 3
    restarts_left_alarm: int = 2
    goodput_min_percent: int = 80
    goodput_minutes: int = 30
    no_spare_alarm: bool = True


@dataclass(frozen=True, kw_only=True)
class AlarmRule:
    """One alarm on the cluster-level series of `metric`: `comparison` of the period's statistic against
    `threshold` for `periods` periods of `period_min` minutes; `action` is the runbook's first step."""

    key: str
    metric: MetricSpec
    comparison: Comparison
    threshold: float
    periods: int
    period_min: int
    action: str


GOODPUT_PERIOD_MIN = 5


def alarm_rules(t: AlarmThresholds) -> list[AlarmRule]:
    """The alarms `t` asks for, in the order docs/metrics.md lists them."""
    rules = [
        AlarmRule(
            key="NoProgress", metric=SECONDS_SINCE_STEP, comparison="GreaterThanThreshold",
            threshold=t.no_progress_minutes * 60.0, periods=1, period_min=1,
            action="no step for a while: read the launcher's last lines (kubectl logs) and docs/runbook.md",
        ),
        AlarmRule(
            key="StaleCheckpoint", metric=CHECKPOINT_AGE_INTERVALS, comparison="GreaterThanThreshold",
            threshold=float(t.stale_checkpoint_intervals), periods=2, period_min=1,
            action="saves fail or are skipped: look for ckpt 'failed' events and the FSx free space",
        ),
        AlarmRule(
            key="RestartBudget", metric=RESTARTS_LEFT, comparison="LessThanOrEqualToThreshold",
            threshold=float(t.restarts_left_alarm), periods=1, period_min=1,
            action="the launcher is close to giving up: find the failing rank or node in the faults table",
        ),
        AlarmRule(
            key="LowGoodput", metric=GOODPUT, comparison="LessThanThreshold",
            threshold=float(t.goodput_min_percent), periods=-(-t.goodput_minutes // GOODPUT_PERIOD_MIN),
            period_min=GOODPUT_PERIOD_MIN,
            action="time is lost to faults, restarts or stalls: make report RUN=<the run folder>",
        ),
    ]  # fmt: skip
    if t.no_spare_alarm:
        rules.append(
            AlarmRule(
                key="NoSpareLeft",
                metric=SPARES_WAITING,
                comparison="LessThanThreshold",
                threshold=1.0,
                periods=3,
                period_min=1,
                action="the next node loss waits for a replacement: check EKS node repair and capacity",
            )
        )
    return rules


def metrics_markdown() -> str:
    """The metric table of docs/metrics.md (a test keeps the file current)."""
    lines = ["| metric | unit | from | statistic | when | meaning |", "|---|---|---|---|---|---|"]
    for m in METRICS:
        lines.append(f"| `{m.name}` | {m.unit} | {m.emitter} | {m.statistic} | {m.when} | {m.meaning} |")
    return "\n".join(lines)


def alarms_markdown(t: AlarmThresholds) -> str:
    """The alarm table of docs/runbook.md at thresholds `t` (the defaults there; a test keeps it current)."""
    ops = {"GreaterThanThreshold": ">", "LessThanThreshold": "<", "LessThanOrEqualToThreshold": "<="}
    lines = ["| alarm | fires when (cluster level) | first thing to do |", "|---|---|---|"]
    for r in alarm_rules(t):
        when = f"{r.metric.statistic} of `{r.metric.name}` {ops[r.comparison]} {r.threshold:g}"
        when += f" for {r.periods} x {r.period_min} min"
        lines.append(f"| `{r.key}` | {when} | {r.action} |")
    return "\n".join(lines)
