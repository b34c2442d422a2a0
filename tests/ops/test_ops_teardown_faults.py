"""Failure paths moto cannot produce, injected at the HTTP boundary (ops_fakeaws.FaultProxy).

Where moto is unrealistic (it deletes security groups in use and stacks with non-empty buckets, EKS objects
vanish at once) the rules below give the answers real AWS gives, so passing proves the handling.
"""

from __future__ import annotations

import json

import pytest
from ops_fakeaws import Response, Rule, error_response
from ops_realism import AwsRealism
from ops_world import CLUSTER, PREFIX, World
from test_ops_teardown import CONFIRM, results_by_id, run


def test_throttling_is_retried_by_botocore_and_the_run_succeeds(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    proxy = fake_aws.proxy
    rules = [
        proxy.fail("cloudformation", "DescribeStacks", "Throttling", times=2, message="Rate exceeded"),
        proxy.fail("ec2", "DescribeVolumes", "RequestLimitExceeded", status=503, times=2),
        proxy.fail("logs", "DescribeLogGroups", "ThrottlingException", times=1),
        proxy.fail(
            "eks", r"re:DELETE /clusters/[^/]+/node-groups/[^/]+", "ThrottlingException", status=429, times=2
        ),
    ]
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--retry-mode", "standard")
    assert code == 3, doc
    assert [r.hits for r in rules] == [2, 2, 1, 2]
    assert f"{CLUSTER}/gpu" not in world.inventory()["nodegroup"]
    assert not any(r["status"] == "failed" for s in doc["steps"] for r in s["results"])


def test_adaptive_mode_also_retries_throttling(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    rule = fake_aws.proxy.fail("elasticloadbalancing", "DeleteTargetGroup", "Throttling", times=2)
    code, doc = run(
        capsys, "--yes", "--confirm", CONFIRM, "--only", "load-balancer", "--only", "target-group"
    )
    assert code == 0, doc
    assert rule.hits == 2
    assert world.ids["tg"] not in world.inventory()["target-group"]


def test_order_means_aws_never_refuses_a_clean_world(
    world: World, realistic: AwsRealism, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code == 3, doc
    assert world.ids["ctl_sg"] not in world.inventory()["security-group"]
    assert world.ids["vpc"] not in world.inventory()["vpc"]
    # the LB went before the SG, the node SG's rule was revoked first, instances and ENIs left the subnet
    # before the network stack: AWS would not have refused anything
    assert realistic.refusals == {}
    sg_step = next(s for s in doc["steps"] if s["kind"] == "security-group")
    assert sg_step["actions"] == [f"revoked rule in {world.ids['node_sg']} referencing {world.ids['ctl_sg']}"]


def test_dependency_violation_is_retried_with_backoff_then_succeeds(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    rule = fake_aws.proxy.fail("ec2", "DeleteSecurityGroup", "DependencyViolation", times=3)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "security-group")
    assert code == 0, doc
    assert rule.hits == 3
    assert fake_aws.proxy.calls("ec2", "DeleteSecurityGroup") == 4
    assert results_by_id(doc)[world.ids["ctl_sg"]]["status"] == "deleted"


def test_persistent_dependency_is_reported_failed_and_foreign_rules_are_not_touched(
    world: World, realistic: AwsRealism, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full(untagged_in_kit_vpc=True)
    ec2 = world.client("ec2")
    stray, ctl = world.ids["stray_sg"], world.ids["ctl_sg"]
    ec2.authorize_security_group_ingress(
        GroupId=stray,
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "UserIdGroupPairs": [{"GroupId": ctl}]}
        ],
    )
    world.client("elbv2").delete_load_balancer(LoadBalancerArn=world.ids["lb"])  # only the rule blocks it
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "security-group", "--timeout", "0.5")
    assert code == 4
    res = results_by_id(doc)[ctl]
    assert res["status"] == "failed" and "DependencyViolation" in res["reason"]
    assert ctl in world.inventory()["security-group"] and stray in world.inventory()["security-group"]
    stray_rules = ec2.describe_security_groups(GroupIds=[stray])["SecurityGroups"][0]["IpPermissions"]
    assert stray_rules and stray_rules[0]["UserIdGroupPairs"][0]["GroupId"] == ctl  # not revoked: not ours


def bucket_has_objects(world: World, bucket: str) -> bool:
    try:
        return bool(world.client("s3").list_object_versions(Bucket=bucket).get("Versions"))
    except world.client("s3").exceptions.NoSuchBucket:
        return False


def bucket_blocks_stack(realistic: AwsRealism, world: World, stack: str, bucket: str) -> None:
    """AWS: deleting a stack whose bucket is not empty ends in DELETE_FAILED (moto deletes it)."""
    realistic.extra[stack] = lambda: (
        [("DataBucket", "AWS::S3::Bucket", "The bucket you tried to delete is not empty")]
        if bucket_has_objects(world, bucket)
        else []
    )


def test_stack_ending_delete_failed_is_reported_with_the_reason_and_rerun_with_data_finishes(
    world: World, fake_aws, realistic: AwsRealism, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    bucket_blocks_stack(realistic, world, f"{PREFIX}-Storage", "kit1-data")
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code == 4
    res = results_by_id(doc)
    storage, network = res[f"{PREFIX}-Storage"], res[f"{PREFIX}-Network"]
    assert storage["status"] == "failed"
    assert (
        "DELETE_FAILED: DataBucket (AWS::S3::Bucket): The bucket you tried to delete is not empty"
        in storage["reason"]
    )
    assert network["status"] == "failed" and network["reason"].startswith("not attempted")
    assert {f"{PREFIX}-Storage", f"{PREFIX}-Network"} <= world.inventory()["stack"]
    # rerun, now allowing the data to go: the bucket is emptied first, so the stack deletes
    fake_aws.proxy.log.clear()
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data")
    assert code == 0, doc
    assert not {f"{PREFIX}-Storage", f"{PREFIX}-Network"} & world.inventory()["stack"]


def test_slow_node_group_deletion_is_waited_for_before_the_cluster(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    path = rf"re:GET /clusters/{CLUSTER}/node-groups/gpu"
    deleting = json.dumps(
        {"nodegroup": {"nodegroupName": "gpu", "clusterName": CLUSTER, "status": "DELETING"}}
    )
    answer = Response(200, {"Content-Type": "application/json"}, deleting.encode())
    started: list[bool] = []
    fake_aws.proxy.add(
        Rule(
            "eks",
            r"re:DELETE /clusters/[^/]+/node-groups/gpu",
            lambda req, fwd: (started.append(True), fwd())[1],
            times=1,
        )
    )
    rule = fake_aws.proxy.add(
        Rule("eks", path, lambda req, fwd: answer, when=lambda r: bool(started), times=3)
    )
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "nodegroup", "--only", "cluster")
    assert code == 0, doc
    assert rule.hits == 3
    log = fake_aws.proxy.log
    last_poll = max(i for i, r in enumerate(log) if r.method == "GET" and r.path.endswith("/node-groups/gpu"))
    delete_cluster = next(
        i for i, r in enumerate(log) if r.method == "DELETE" and r.path.endswith(f"/clusters/{CLUSTER}")
    )
    assert last_poll < delete_cluster


def test_a_deletion_that_never_finishes_times_out_as_failed(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    body = json.dumps({"nodegroup": {"nodegroupName": "gpu", "clusterName": CLUSTER, "status": "DELETING"}})
    fake_aws.proxy.add(
        Rule(
            "eks",
            rf"re:GET /clusters/{CLUSTER}/node-groups/gpu",
            lambda req, fwd: Response(200, {"Content-Type": "application/json"}, body.encode()),
            when=lambda r: (
                fake_aws.proxy.calls("eks", "") > 0 and any(x.method == "DELETE" for x in fake_aws.proxy.log)
            ),
        )
    )
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "nodegroup", "--timeout", "0.3")
    assert code == 4
    res = results_by_id(doc)[f"{CLUSTER}/gpu"]
    assert res["status"] == "failed" and "timed out" in res["reason"] and "DELETING" in res["reason"]


def test_error_bodies_parse_like_aws() -> None:
    """The injected bodies are what botocore parses into code + message (guards the fake itself)."""
    for service in ("ec2", "cloudformation", "s3", "logs"):
        resp = error_response(service, "SomeCode", "some message", 400)
        assert b"SomeCode" in resp.body and b"some message" in resp.body


def test_a_kind_that_cannot_be_listed_is_reported_and_the_others_still_go(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    fake_aws.proxy.fail(
        "fsx",
        "DescribeFileSystems",
        "AccessDeniedException",
        times=None,
        message="not authorized to perform fsx:DescribeFileSystems",
    )
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "fsx", "--only", "ecr")
    assert code == 4
    fsx = next(s for s in doc["steps"] if s["kind"] == "fsx")
    assert fsx["error"] and "AccessDeniedException" in fsx["note"]
    assert "kit1/trainer" not in world.inventory()["ecr"]
    assert world.ids["fsx"] in world.inventory()["fsx"]


def test_an_export_still_imported_by_a_kept_stack_blocks_its_exporter(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """AWS refuses to delete a stack whose export is imported; moto deletes it, so teardown checks itself."""
    world.stacks(protect_storage=True)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "stack")
    assert code == 4
    res = results_by_id(doc)
    assert res[f"{PREFIX}-Storage"]["status"] == "kept"
    assert "termination protection" in res[f"{PREFIX}-Storage"]["reason"]
    net = res[f"{PREFIX}-Network"]
    assert net["status"] == "failed" and f"still imported by {PREFIX}-Storage" in net["reason"]
    assert {f"{PREFIX}-Storage", f"{PREFIX}-Network"} <= world.inventory()["stack"]
