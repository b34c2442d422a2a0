"""The training dashboard and alarms: what the trainer and launcher say live (training/runtime/telemetry), on
one page per cluster, with the pages an on-call person needs.

Every metric name, unit, statistic and dimension comes from `fsdpkit.contracts.metrics_catalog`, the module
the trainer and launcher publish from, so an alarm cannot watch a metric nobody emits. Alarms watch the
cluster-level series (dimension ClusterName alone, which every record also carries): one alarm covers every
job of the cluster, whatever its name; the dashboard shows each job apart with SEARCH expressions. A job that
emits nothing (finished, or not started) is "missing data", which no alarm treats as breaching: a stuck
launcher still reports SecondsSinceStep, a hung rank 0 still reports its gauges.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.metrics_catalog import MetricSpec, alarm_rules
from fsdpkit.contracts.metrics_settings import log_group_name
from fsdpkit.infra.config import MonitoringConfig

PERIOD = Duration.minutes(1)


COMPARISON = {
    "GreaterThanThreshold": cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
    "LessThanThreshold": cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
    "LessThanOrEqualToThreshold": cloudwatch.ComparisonOperator.LESS_THAN_OR_EQUAL_TO_THRESHOLD,
}


def cluster_metric(spec: MetricSpec, cluster: str, period: Duration = PERIOD) -> cloudwatch.Metric:
    """The cluster-level series of `spec`: every job's records also carry ClusterName alone."""
    return cloudwatch.Metric(
        namespace=catalog.NAMESPACE,
        metric_name=spec.name,
        dimensions_map={catalog.CLUSTER: cluster},
        statistic=spec.statistic,
        period=period,
    )


def per_job(spec: MetricSpec, cluster: str, *, by_fault_class: bool = False) -> cloudwatch.MathExpression:
    """One line per job (and per fault class) of `spec`, found by a SEARCH over the job-level series."""
    keys = [catalog.CLUSTER, catalog.JOB] + ([catalog.FAULT_CLASS] if by_fault_class else [])
    schema = ",".join([catalog.NAMESPACE, *keys])
    query = f'{{{schema}}} MetricName="{spec.name}" {catalog.CLUSTER}="{cluster}"'
    return cloudwatch.MathExpression(
        expression=f"SEARCH('{query}', '{spec.statistic}', {int(PERIOD.to_seconds())})",
        using_metrics={},
        label="",
        period=PERIOD,
    )


class TrainingMonitoring(Construct):
    """The metrics log group, the alarm topic (KMS-encrypted, TLS only, `alarm_emails` subscribed), the
    alarms of `alarm_rules` and the `<cluster>-training` dashboard."""

    def __init__(
        self, scope: Construct, construct_id: str, *, cfg: MonitoringConfig, cluster_name: str
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self,
            "MetricsLogGroup",
            log_group_name=log_group_name(cluster_name),
            removal_policy=RemovalPolicy.DESTROY,
        )
        # The L2 takes retention as named constants; the config holds the days CloudWatch Logs accepts.
        self.log_group.node.default_child.retention_in_days = cfg.log_retention_days
        key = kms.Key(
            self,
            "AlarmTopicKey",
            description=f"{cluster_name}: encrypts the training alarm topic",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Alarms publish to an encrypted topic only when the key's policy lets CloudWatch (aws/sns does not).
        key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        self.topic = sns.Topic(
            self,
            "AlarmTopic",
            display_name=f"{cluster_name} training alarms",
            master_key=key,
            enforce_ssl=True,
        )
        for email in cfg.alarm_emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.rules = alarm_rules(cfg.thresholds)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for rule in self.rules:
            alarm = cloudwatch.Alarm(
                self,
                rule.key,
                alarm_name=f"{cluster_name}-training-{rule.key}",
                alarm_description=f"{rule.metric.name}: {rule.action}",
                metric=cluster_metric(rule.metric, cluster_name, Duration.minutes(rule.period_min)),
                threshold=rule.threshold,
                comparison_operator=COMPARISON[rule.comparison],
                evaluation_periods=rule.periods,
                datapoints_to_alarm=rule.periods,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(self.topic))
            alarm.add_ok_action(cloudwatch_actions.SnsAction(self.topic))
            self.alarms[rule.key] = alarm
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{cluster_name}-training", default_interval=Duration.hours(6)
        )
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(
                alarms=list(self.alarms.values()), title="Alarms", width=24, height=3
            )
        )
        for row in catalog.DASHBOARD_ROWS:
            self.dashboard.add_widgets(
                *(
                    cloudwatch.GraphWidget(
                        title=f"{spec.name} ({spec.unit}, {spec.statistic})",
                        left=[per_job(spec, cluster_name, by_fault_class=spec is catalog.FAULTS)],
                        width=6,
                        height=6,
                    )
                    for spec in row
                )
            )
