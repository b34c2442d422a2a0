"""A rerun finishes what a first run left, with AWS's refusals injected where moto would let it through.

`realistic` (ops_realism.AwsRealism) answers as AWS does: an in-use security group, subnet or VPC gives
DependencyViolation, a protected load balancer OperationNotPermitted, and a stack whose VPC, subnet or group
is still used from outside ends DELETE_FAILED with the reasons in its events.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from ops_fakeaws import Response, Rule
from ops_realism import AwsRealism
from ops_world import CLUSTER, PREFIX, ROLE, World, tags_list
from test_ops_teardown import CONFIRM, assert_decoys_survive, plan_of, results_by_id, run

SHORT = ("--timeout", "0.5")
"""Refusals that never clear are retried until the step's deadline: keep it short."""


def protect(world: World, on: bool) -> None:
    world.client("elbv2").modify_load_balancer_attributes(
        LoadBalancerArn=world.ids["lb"],
        Attributes=[{"Key": "deletion_protection.enabled", "Value": str(on).lower()}],
    )


def test_rerun_after_the_cluster_is_gone_deletes_the_kept_load_balancer_and_its_target_group(
    world: World, realistic: AwsRealism, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    protect(world, True)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)
    assert code == 4, doc
    first = results_by_id(doc)
    lb, tg, sg = world.ids["lb"], world.ids["tg"], world.ids["ctl_sg"]
    assert first[lb]["status"] == "kept" and "deletion protection" in first[lb]["reason"]
    assert first[tg]["status"] == "failed" and "ResourceInUse" in first[tg]["reason"]  # the LB's listener
    assert first[sg]["status"] == "failed" and "DependencyViolation" in first[sg]["reason"]  # the LB uses it
    network = first[f"{PREFIX}-Network"]
    assert network["status"] == "failed"
    assert "Subnet (AWS::EC2::Subnet): The subnet" in network["reason"]  # the LB is still in it
    assert realistic.refusals["DeleteSecurityGroup"] >= 1 and realistic.refusals["DeleteStack"] == 1
    cluster_step = next(s for s in doc["steps"] if s["kind"] == "cluster")
    assert cluster_step["actions"] == [
        f"tagged 5 controller resource(s) of {CLUSTER} with kit:project={PREFIX} "
        "so a rerun finds them after the cluster is gone"
    ]
    now = world.inventory()
    assert (
        CLUSTER not in now["cluster"]
    )  # the cluster went: its controllers' tags name a cluster that is gone
    assert {lb, tg, sg} <= now["load-balancer"] | now["target-group"] | now["security-group"]

    protect(world, False)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)
    assert code == 0, doc
    assert doc["clusters"] == []
    second = results_by_id(doc)
    for arn in (lb, tg, sg):
        assert second[arn]["status"] == "deleted", second[arn]
    assert plan_of(doc)[lb]["reason"].startswith(f"kit:project={PREFIX}")
    now = world.inventory()
    assert (
        lb not in now["load-balancer"] and tg not in now["target-group"] and sg not in now["security-group"]
    )
    assert f"{PREFIX}-Network" not in now["stack"] and world.ids["vpc"] not in now["vpc"]
    assert_decoys_survive(world)


def test_full_order_through_aws_refusals_reaches_a_clean_end_on_rerun(
    world: World, realistic: AwsRealism, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone's untagged ENI and security group in the kit VPC: kept (not owned), so the network stack
    ends DELETE_FAILED with AWS's reasons; once their owner removes them, the rerun converges."""
    world.full(untagged_in_kit_vpc=True)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)
    assert code == 4, doc
    res = results_by_id(doc)
    for key in ("stray_eni", "stray_sg"):
        assert res[world.ids[key]]["status"] == "kept" and res[world.ids[key]]["reason"].startswith(
            "not owned"
        )
    network = res[f"{PREFIX}-Network"]["reason"]
    assert network.startswith("DELETE_FAILED: ")
    assert f"The subnet '{world.ids['subnet']}' has dependencies" in network
    assert f"The vpc '{world.ids['vpc']}' has dependencies" in network
    assert res[f"{PREFIX}-Storage"]["status"] == "deleted"
    owned = world.owned()
    now = world.inventory()
    for kind, ids in owned.items():
        if kind != "stack":
            assert not (ids & now[kind]), (kind, ids & now[kind])
    assert_decoys_survive(world)

    # their owner cleans up; teardown is run again
    ec2 = world.client("ec2")
    ec2.delete_network_interface(NetworkInterfaceId=world.ids.pop("stray_eni"))
    ec2.delete_security_group(GroupId=world.ids.pop("stray_sg"))
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)
    assert code == 0, doc
    assert results_by_id(doc)[f"{PREFIX}-Network"]["status"] == "deleted"
    now = world.inventory()
    assert f"{PREFIX}-Network" not in now["stack"] and world.ids["vpc"] not in now["vpc"]
    assert_decoys_survive(world)
    assert run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)[0] == 5  # nothing left


def test_a_cluster_deleted_outside_teardown_still_owns_what_its_controllers_left(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cdk destroy` or the console removed the cluster and its stack: the deleted stack's `ClusterName`
    output still says the cluster was the kit's, so its controllers' leftovers are planned."""
    world.stacks()
    world.cluster_stack()
    world.eks()
    world.controller_leftovers()
    eks, cfn = world.client("eks"), world.client("cloudformation")
    eks.delete_nodegroup(clusterName=CLUSTER, nodegroupName="gpu")
    eks.delete_cluster(name=CLUSTER)
    cfn.delete_stack(StackName=f"{PREFIX}-Cluster")
    code, doc = run(capsys)
    assert code == 0, doc
    plan = plan_of(doc)
    for key in ("lb", "tg", "ctl_sg"):
        p = plan[world.ids[key]]
        assert p["action"] == "delete" and p["reason"] == f"elbv2.k8s.aws/cluster={CLUSTER}", (key, p)
    assert plan[world.ids["ebs"]]["reason"] == f"kubernetes.io/cluster/{CLUSTER}=owned"
    for key in ("decoy_lb", "decoy_ebs"):
        assert world.ids[key] not in plan or plan[world.ids[key]]["action"] == "keep"
    assert doc["clusters"] == [] and doc["former_clusters"] == [CLUSTER]

    # a new cluster of that name that is not the kit's: the old tags are no longer evidence
    eks.create_cluster(
        name=CLUSTER, roleArn=ROLE, resourcesVpcConfig={"subnetIds": [world.ids["other_subnet"]]}
    )
    code, doc = run(capsys)
    assert doc["former_clusters"] == []
    lb = plan_of(doc)[world.ids["lb"]]
    assert lb["action"] == "keep" and lb["reason"].startswith("not owned")


def test_a_cluster_whose_controller_resources_cannot_be_tagged_is_kept_and_the_rerun_converges(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting the cluster anyway would leave its leftovers unclaimable; kept, a rerun finishes."""
    world.full()
    protect(world, True)  # the LB survives the first run: only the kit tag can claim it later
    denied = fake_aws.proxy.fail(
        "elasticloadbalancing",
        "AddTags",
        "AccessDenied",
        status=403,
        times=None,
        message="not authorized to perform: elasticloadbalancing:AddTags",
    )
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)
    res = results_by_id(doc)
    assert code == 4, doc  # the protected LB's listener holds its target group
    assert res[world.ids["tg"]]["status"] == "failed" and "ResourceInUse" in res[world.ids["tg"]]["reason"]
    kept = res[CLUSTER]
    assert kept["status"] == "kept", kept
    assert "AccessDenied" in kept["reason"] and "rerun" in kept["reason"]
    assert denied.hits == 1 and CLUSTER in world.inventory()["cluster"]
    assert res[world.ids["lb"]]["status"] == "kept"

    fake_aws.proxy.rules.remove(denied)
    protect(world, False)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data", *SHORT)
    assert code == 0, doc
    res = results_by_id(doc)
    assert res[CLUSTER]["status"] == "deleted" and res[world.ids["lb"]]["status"] == "deleted"
    now = world.inventory()
    assert CLUSTER not in now["cluster"] and world.ids["lb"] not in now["load-balancer"]
    assert_decoys_survive(world)


def stamp_deletion_time(proxy, when: datetime) -> None:
    """AWS's ListStacks gives a deleted stack's DeletionTime; moto leaves it out."""
    stamp = f"<StackStatus>DELETE_COMPLETE</StackStatus><DeletionTime>{when.isoformat()}</DeletionTime>"

    def respond(req, fwd) -> Response:
        r = fwd()
        body = r.body.replace(b"<StackStatus>DELETE_COMPLETE</StackStatus>", stamp.encode())
        return Response(r.status, r.headers, body)

    proxy.add(Rule("cloudformation", "ListStacks", respond))


def test_a_reused_cluster_name_is_no_evidence_for_what_the_later_cluster_made(
    world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kit's cluster and its stack are deleted; a cluster that is not the kit's takes the name, makes a
    load balancer and a volume, and is deleted too, within CloudFormation's 90 days. The name is evidence
    only for what was made before the kit stack's deletion."""
    world.stacks()
    world.cluster_stack()
    world.eks()
    world.controller_leftovers()
    world.client("logs").create_log_group(logGroupName=f"/aws/eks/{CLUSTER}/old")
    # (EBS CreateTime has second resolution: in moto the two clusters' volumes may share a second)
    eks, cfn, ec2, elbv2 = (world.client(s) for s in ("eks", "cloudformation", "ec2", "elbv2"))
    eks.delete_nodegroup(clusterName=CLUSTER, nodegroupName="gpu")
    eks.delete_cluster(name=CLUSTER)
    cfn.delete_stack(StackName=f"{PREFIX}-Cluster")
    stamp_deletion_time(fake_aws.proxy, datetime.now(UTC))

    eks.create_cluster(
        name=CLUSTER, roleArn=ROLE, resourcesVpcConfig={"subnetIds": [world.ids["other_subnet"]]}
    )
    theirs = {"elbv2.k8s.aws/cluster": CLUSTER}
    new_lb = elbv2.create_load_balancer(
        Name="theirs", Subnets=[world.ids["other_subnet"]], Tags=tags_list(theirs)
    )["LoadBalancers"][0]["LoadBalancerArn"]
    new_tg = elbv2.create_target_group(
        Name="theirs", Protocol="HTTP", Port=80, VpcId=world.ids["other_vpc"], Tags=tags_list(theirs)
    )["TargetGroups"][0]["TargetGroupArn"]
    new_sg = ec2.create_security_group(
        GroupName="theirs",
        Description="x",
        VpcId=world.ids["other_vpc"],
        TagSpecifications=[{"ResourceType": "security-group", "Tags": tags_list(theirs)}],
    )["GroupId"]
    new_logs = f"/aws/eks/{CLUSTER}/cluster"  # the later cluster's control-plane log group
    world.client("logs").create_log_group(logGroupName=new_logs)
    eks.delete_cluster(name=CLUSTER)

    code, doc = run(capsys)
    assert code == 0, doc
    assert doc["former_clusters"] == [CLUSTER]
    plan = plan_of(doc)
    for key in ("lb", "tg", "ctl_sg", "ebs"):  # the kit cluster's leftovers: still planned
        assert plan[world.ids[key]]["action"] == "delete", (key, plan[world.ids[key]])
    assert plan[f"/aws/eks/{CLUSTER}/old"]["reason"] == f"log group of kit cluster {CLUSTER}"
    for rid in (new_lb, new_tg, new_sg, new_logs):  # the later cluster's: not the kit's
        assert rid not in plan or plan[rid]["action"] == "keep", plan[rid]
