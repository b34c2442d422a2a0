"""Failure paths moto cannot produce, injected at the HTTP boundary (ops_fakeaws.FaultProxy).

Where moto is unrealistic (it deletes security groups in use and stacks with non-empty buckets, EKS objects
vanish at once) the rules below give the answers real AWS gives, so passing proves the handling.
"""

from __future__ import annotations

import json
import re

import pytest
from ops_fakeaws import FaultProxy, Request, Response, Rule, error_response
from ops_world import CLUSTER, PREFIX, World
from test_ops_teardown import CONFIRM, results_by_id, run


def sg_in_use(world: World, group_id: str) -> bool:
    """What AWS checks before deleting a security group (moto does not)."""
    ec2, elbv2 = world.client("ec2"), world.client("elbv2")
    for g in ec2.describe_security_groups()["SecurityGroups"]:
        for perm in g.get("IpPermissions", []) + g.get("IpPermissionsEgress", []):
            if any(p.get("GroupId") == group_id for p in perm.get("UserIdGroupPairs", [])):
                return True
    enis = ec2.describe_network_interfaces(Filters=[{"Name": "group-id", "Values": [group_id]}])
    lbs = elbv2.describe_load_balancers()["LoadBalancers"]
    return bool(enis["NetworkInterfaces"]) or any(group_id in lb.get("SecurityGroups", []) for lb in lbs)


def realistic_security_groups(proxy: FaultProxy, world: World) -> Rule:
    return proxy.fail(
        "ec2",
        "DeleteSecurityGroup",
        "DependencyViolation",
        times=None,
        when=lambda r: sg_in_use(world, r.params["GroupId"]),
        message="resource has a dependent object",
    )


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


def test_order_means_a_realistic_security_group_never_answers_in_use(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    rule = realistic_security_groups(fake_aws.proxy, world)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code == 3, doc
    assert world.ids["ctl_sg"] not in world.inventory()["security-group"]
    # the LB went before the SG, and the node SG's rule was revoked first: AWS would not have refused
    assert rule.hits == 0
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
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
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
    realistic_security_groups(fake_aws.proxy, world)
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


def realistic_stack_with_bucket(proxy: FaultProxy, world: World, stack: str, bucket: str) -> None:
    """AWS: deleting a stack whose bucket is not empty ends in DELETE_FAILED (moto deletes it)."""
    failed: set[str] = set()

    def is_stack(r: Request) -> bool:
        return stack in r.params.get("StackName", "")

    def swallow_delete(req: Request, fwd) -> Response:
        failed.add(stack)
        body = (
            "<DeleteStackResponse><ResponseMetadata><RequestId>inj</RequestId></ResponseMetadata>"
            "</DeleteStackResponse>"
        )
        return Response(200, {"Content-Type": "text/xml"}, body.encode())

    def describe_failed(req: Request, fwd) -> Response:
        resp = fwd()
        body = re.sub(
            rb"<StackStatus>[A-Z_]+</StackStatus>", b"<StackStatus>DELETE_FAILED</StackStatus>", resp.body
        )
        return Response(resp.status, resp.headers, body)

    def events(req: Request, fwd) -> Response:
        ev = (
            "<member><StackId>{sid}</StackId><EventId>{n}</EventId><StackName>{s}</StackName>"
            "<LogicalResourceId>{lid}</LogicalResourceId><ResourceType>{t}</ResourceType>"
            "<Timestamp>2026-01-01T00:00:0{n}Z</Timestamp><ResourceStatus>{st}</ResourceStatus>"
            "<ResourceStatusReason>{why}</ResourceStatusReason></member>"
        )
        sid = req.params["StackName"]
        members = ev.format(
            sid=sid,
            n=2,
            s=stack,
            lid="DataBucket",
            t="AWS::S3::Bucket",
            st="DELETE_FAILED",
            why="The bucket you tried to delete is not empty",
        ) + ev.format(
            sid=sid,
            n=1,
            s=stack,
            lid=stack,
            t="AWS::CloudFormation::Stack",
            st="DELETE_IN_PROGRESS",
            why="User Initiated",
        )
        body = (
            f"<DescribeStackEventsResponse><DescribeStackEventsResult><StackEvents>{members}</StackEvents>"
            "</DescribeStackEventsResult></DescribeStackEventsResponse>"
        )
        return Response(200, {"Content-Type": "text/xml"}, body.encode())

    proxy.add(
        Rule(
            "cloudformation",
            "DeleteStack",
            swallow_delete,
            when=lambda r: is_stack(r) and bucket_has_objects(world, bucket),
        )
    )
    proxy.add(
        Rule(
            "cloudformation", "DeleteStack", lambda req, fwd: (failed.discard(stack), fwd())[1], when=is_stack
        )
    )  # the bucket is empty now: AWS deletes the stack
    proxy.add(
        Rule(
            "cloudformation",
            "DescribeStacks",
            describe_failed,
            when=lambda r: is_stack(r) and stack in failed,
        )
    )
    proxy.add(Rule("cloudformation", "DescribeStackEvents", events, when=is_stack))


def test_stack_ending_delete_failed_is_reported_with_the_reason_and_rerun_with_data_finishes(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    realistic_stack_with_bucket(fake_aws.proxy, world, f"{PREFIX}-Storage", "kit1-data")
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
