"""The dashboard and alarms in the synthesized cluster template watch exactly the series the trainer and the
launcher emit (fsdpkit.contracts.metrics_catalog: one source of the names), at the thresholds cdk.json
sets."""

from __future__ import annotations

import json
from typing import Any

from fsdpkit.contracts import metrics_catalog as catalog
from fsdpkit.contracts.metrics_settings import log_group_name
from fsdpkit.infra.constructs.monitoring import COMPARISON
from tests.infra.conftest import Synth


def _resources(template: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == kind]


def test_every_alarm_watches_an_emitted_cluster_series_at_the_configured_threshold(synth: Synth) -> None:
    for variant in ("default", "block"):
        cfg = synth.configs[variant]
        template = synth.template(variant, "cluster")
        alarms = {a["AlarmName"]: a for a in _resources(template, "AWS::CloudWatch::Alarm")}
        rules = catalog.alarm_rules(cfg.monitoring.thresholds)
        assert sorted(alarms) == sorted(f"{cfg.prefix}-training-{r.key}" for r in rules)
        for rule in rules:
            alarm = alarms[f"{cfg.prefix}-training-{rule.key}"]
            spec = catalog.BY_NAME[alarm["MetricName"]]
            assert spec is rule.metric and alarm["Namespace"] == catalog.NAMESPACE
            assert alarm["Dimensions"] == [{"Name": catalog.CLUSTER, "Value": cfg.prefix}]
            assert (catalog.CLUSTER,) in catalog.DIMENSION_SETS  # every record carries this set
            assert alarm["Statistic"] == spec.statistic and alarm["Period"] == 60 * rule.period_min
            assert alarm["ComparisonOperator"] == rule.comparison and rule.comparison in COMPARISON
            assert alarm["Threshold"] == rule.threshold and alarm["EvaluationPeriods"] == rule.periods
            assert alarm["TreatMissingData"] == "notBreaching"
            assert alarm["AlarmActions"] == alarm["OKActions"] and len(alarm["AlarmActions"]) == 1
    block = {
        a["AlarmName"]: a for a in _resources(synth.template("block", "cluster"), "AWS::CloudWatch::Alarm")
    }
    assert block["kit-block-training-NoProgress"]["Threshold"] == 20 * 60
    assert block["kit-block-training-LowGoodput"]["EvaluationPeriods"] == 3  # 12 minutes in 5-minute periods
    assert "kit-block-training-NoSpareLeft" not in block


def test_the_dashboard_graphs_every_catalog_metric_per_job(synth: Synth) -> None:
    (dashboard,) = _resources(synth.template("default", "cluster"), "AWS::CloudWatch::Dashboard")
    body = json.loads(
        "".join(p if isinstance(p, str) else "" for p in dashboard["DashboardBody"]["Fn::Join"][1])
    )
    searches = [m[0]["expression"] for w in body["widgets"] for m in w["properties"].get("metrics", [])]
    for spec in catalog.METRICS:
        wanted = f'MetricName="{spec.name}" ClusterName="fsdp-kit"'
        assert sum(wanted in s and f"'{spec.statistic}'" in s for s in searches) == 1, spec.name
    assert sorted(m.name for row in catalog.DASHBOARD_ROWS for m in row) == sorted(
        m.name for m in catalog.METRICS
    )


def test_topic_log_group_and_subscriptions(synth: Synth) -> None:
    block = synth.template("block", "cluster")
    (topic,) = _resources(block, "AWS::SNS::Topic")
    assert "KmsMasterKeyId" in topic
    emails = sorted(s["Endpoint"] for s in _resources(block, "AWS::SNS::Subscription"))
    assert emails == ["ml-team@example.org", "oncall@example.com"]
    (group,) = [
        g
        for g in _resources(block, "AWS::Logs::LogGroup")
        if g.get("LogGroupName") == log_group_name("kit-block")
    ]
    assert group["RetentionInDays"] == 90
    assert _resources(synth.template("default", "cluster"), "AWS::SNS::Subscription") == []
    odcr = synth.template("odcr", "cluster")
    assert _resources(odcr, "AWS::CloudWatch::Alarm") == [] and _resources(odcr, "AWS::SNS::Topic") == []


def test_the_agent_listens_for_emf(synth: Synth) -> None:
    addons = _resources(synth.template("default", "cluster"), "AWS::EKS::Addon")
    (cloudwatch,) = [a for a in addons if a["AddonName"] == "amazon-cloudwatch-observability"]
    config = json.loads(cloudwatch["ConfigurationValues"])
    assert config["agent"]["config"]["logs"]["metrics_collected"]["emf"] == {}
