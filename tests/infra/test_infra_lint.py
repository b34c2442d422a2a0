"""cfn-lint on every template, cdk-nag AwsSolutions in the session synth, tags and context hygiene."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fsdpkit.infra.lint import cfn_lint_commands
from fsdpkit.infra.tags import PROJECT_TAG, STACK_TAG
from tests.infra.conftest import VARIANTS, Synth

# CloudFormation types in the templates that take no tags (checked against the resource specs by cfn-lint's
# schemas: none of them has a Tags property).
UNTAGGABLE = {
    "AWS::EC2::Route",
    "AWS::EC2::SubnetRouteTableAssociation",
    "AWS::EC2::VPCGatewayAttachment",
    "AWS::EC2::SecurityGroupIngress",
    "AWS::EC2::SecurityGroupEgress",
    "AWS::EC2::VPCEndpoint",
    "AWS::IAM::Policy",
    "AWS::SNS::TopicPolicy",
    "AWS::SNS::Subscription",
    "AWS::Lambda::LayerVersion",
}


def test_cfn_lint_passes_every_template(synth: Synth) -> None:
    """One cfn-lint process per region over that region's templates (all variants), with the kit's config."""
    commands = cfn_lint_commands(synth.outdir)
    regions = {c[c.index("--regions") + 1]: c[c.index("--") + 1 :] for c in commands}
    assert sorted(regions) == sorted({cfg.region for cfg in synth.configs.values()})
    assert sum(len(t) for t in regions.values()) == len(synth.templates) == 4 * len(VARIANTS)
    placed = synth.configs["placed"].prefix
    assert all(Path(t).name.startswith(f"{placed}-") for t in regions[synth.configs["placed"].region])
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout == ""


def nag_report(synth: Synth) -> dict[str, Any]:
    (report,) = [p for p in synth.validation_report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return report


def test_cdk_nag_has_no_open_findings(synth: Synth) -> None:
    report = nag_report(synth)
    open_findings = [
        (v["ruleName"], [c["constructPath"] for c in v["violatingConstructs"]]) for v in report["violations"]
    ]
    assert open_findings == []
    assert report["conclusion"] == "success"


def test_every_acknowledged_finding_has_a_reason(synth: Synth) -> None:
    acknowledged = nag_report(synth)["suppressedViolations"]
    assert acknowledged, "the kit uses AWS-managed policies, so there must be acknowledged IAM4 findings"
    for finding in acknowledged:
        assert len(finding["reason"]) >= 40, finding["ruleName"]
    rules = {f["ruleName"].split("[")[0] for f in acknowledged}
    assert rules <= {"AwsSolutions-IAM4", "AwsSolutions-IAM5", "AwsSolutions-L1"}


def test_no_missing_context_and_no_dummy_azs(synth: Synth) -> None:
    assert "missing" not in synth.manifest
    for name, template in synth.templates.items():
        assert "dummy" not in json.dumps(template), f"{name} was synthesized with dummy AZs"


def _tags(props: dict[str, Any]) -> dict[str, str]:
    tags = props.get("Tags")
    if isinstance(tags, dict):
        return tags
    if isinstance(tags, list):
        return {t["Key"]: t["Value"] for t in tags}
    specs = props.get("TagSpecifications", [])
    return {t["Key"]: t["Value"] for s in specs for t in s["Tags"]}


def test_every_taggable_resource_carries_the_kit_tags(synth: Synth) -> None:
    untagged = []
    for stack_name, template in synth.templates.items():
        prefix = stack_name.rsplit("-", 1)[0]
        for logical_id, resource in template["Resources"].items():
            kind = resource["Type"]
            if kind in UNTAGGABLE or kind.startswith("Custom::") or kind == "AWS::SSM::Parameter":
                continue
            tags = _tags(resource.get("Properties", {}))
            if tags.get(PROJECT_TAG) != prefix or tags.get(STACK_TAG) != stack_name:
                untagged.append(f"{stack_name}/{logical_id} ({kind})")
    assert untagged == []


def test_instances_launched_by_node_groups_are_tagged(synth: Synth) -> None:
    """Managed node groups do not pass their tags on; the launch templates tag instances, volumes and ENIs."""
    template = synth.template("default", "cluster")
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::EC2::LaunchTemplate":
            continue
        specs = resource["Properties"]["LaunchTemplateData"]["TagSpecifications"]
        assert {s["ResourceType"] for s in specs} == {"instance", "volume", "network-interface"}
        for spec in specs:
            assert {t["Key"]: t["Value"] for t in spec["Tags"]} == {
                PROJECT_TAG: "fsdp-kit",
                STACK_TAG: "fsdp-kit-cluster",
            }


def test_stacks_carry_the_kit_tags_for_cloudformation_to_propagate(synth: Synth) -> None:
    for artifact_id, artifact in synth.manifest["artifacts"].items():
        if artifact["type"] != "aws:cloudformation:stack":
            continue
        tags = artifact["properties"]["tags"]
        assert tags[STACK_TAG] == artifact["properties"].get("stackName", artifact_id)
        assert tags[PROJECT_TAG] == artifact_id.rsplit("-", 1)[0]


def test_summary_counts_resources_per_stack(synth: Synth) -> None:
    from fsdpkit.infra.summary import summarize

    rows = {stack: (count, outputs) for stack, count, outputs, _ in summarize(synth.outdir)}
    assert rows == {
        name: (len(t["Resources"]), len(t.get("Outputs", {}))) for name, t in synth.templates.items()
    }


def test_lint_and_summary_refuse_a_missing_assembly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fsdpkit.infra import lint, summary

    assert lint.main([str(tmp_path)]) == 2
    assert summary.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: no cloud assembly in {tmp_path}; run `make synth` first",
        f"error: no *.template.json in {tmp_path}; run `make synth` first",
    ]
