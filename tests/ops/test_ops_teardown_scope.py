"""Every kit-tagged resource is in the plan, found by its tag whatever its name, in this region only."""

from __future__ import annotations

import json

import boto3
import pytest
from ops_world import CLUSTER, KIT, OTHER_CLUSTER, PREFIX, ROLE, World, tags_list
from test_ops_teardown import CONFIRM, plan_of, results_by_id, run

from fsdpkit.ops.teardown.__main__ import main


def kit_vpc_and_p5_alone(world: World) -> None:
    """No stack, no cluster: a VPC and a running p5 that carry the kit tag and nothing else (no prefix)."""
    ec2 = world.client("ec2")
    spec = lambda kind: [{"ResourceType": kind, "Tags": tags_list(KIT)}]  # noqa: E731
    vpc = ec2.create_vpc(CidrBlock="10.60.0.0/16", TagSpecifications=spec("vpc"))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.60.1.0/24")["Subnet"]["SubnetId"]
    world.ids["lone_vpc"] = vpc
    world.ids["lone_p5"] = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        InstanceType="p5.48xlarge",
        SubnetId=subnet,
        TagSpecifications=spec("instance"),
    )["Instances"][0]["InstanceId"]


def test_a_kit_tagged_vpc_and_instance_alone_are_planned_not_nothing_tagged(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    kit_vpc_and_p5_alone(world)
    code, doc = run(capsys)
    assert code == 0, doc
    plan = plan_of(doc)
    p5, vpc = world.ids["lone_p5"], world.ids["lone_vpc"]
    assert (
        plan[p5]["action"] == "delete" and plan[p5]["reason"] == f"kit:project={PREFIX}; p5.48xlarge running"
    )
    assert plan[vpc]["action"] == "keep"
    assert plan[vpc]["reason"] == "teardown has no deleter for ec2:vpc outside a stack; delete it yourself"
    # confirmed: the p5 stops billing, the VPC stays and the run says so (exit 3: kept)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code == 3, doc
    res = results_by_id(doc)
    assert res[p5]["status"] == "deleted" and res[vpc]["status"] == "kept"
    assert p5 not in world.inventory()["instance"] and vpc in world.inventory()["vpc"]


def test_a_protected_instance_is_kept_with_the_reason(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    kit_vpc_and_p5_alone(world)
    world.client("ec2").modify_instance_attribute(
        InstanceId=world.ids["lone_p5"], DisableApiTermination={"Value": True}
    )
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "instance")
    assert code == 3, doc
    res = results_by_id(doc)[world.ids["lone_p5"]]
    assert res["status"] == "kept" and "termination protection" in res["reason"]
    assert world.ids["lone_p5"] in world.inventory()["instance"]


def test_every_tag_lookup_finds_names_without_the_prefix(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Log groups, buckets, volumes, security groups, ENIs (outside any kit VPC), repositories, clusters and
    stacks named freely: each is found by its tag."""
    ec2, logs, s3 = world.client("ec2"), world.client("logs"), world.client("s3")
    spec = lambda kind: [{"ResourceType": kind, "Tags": tags_list(KIT)}]  # noqa: E731
    logs.create_log_group(logGroupName="/training/events", tags=KIT)
    logs.create_log_group(logGroupName="/training/other")  # decoy: same name shape, no tag
    s3.create_bucket(Bucket="ckpt-archive-42")
    s3.put_bucket_tagging(Bucket="ckpt-archive-42", Tagging={"TagSet": tags_list(KIT)})
    vol = ec2.create_volume(AvailabilityZone="us-east-1a", Size=5, TagSpecifications=spec("volume"))[
        "VolumeId"
    ]
    vpc = ec2.create_vpc(CidrBlock="10.70.0.0/16")["Vpc"]["VpcId"]  # not the kit's
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.70.1.0/24")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(
        GroupName="web", Description="x", VpcId=vpc, TagSpecifications=spec("security-group")
    )["GroupId"]
    eni = ec2.create_network_interface(SubnetId=subnet, TagSpecifications=spec("network-interface"))[
        "NetworkInterface"
    ]["NetworkInterfaceId"]
    decoy_sg = ec2.create_security_group(GroupName="web2", Description="x", VpcId=vpc)["GroupId"]
    world.client("ecr").create_repository(repositoryName="trainer-images", tags=tags_list(KIT))
    world.client("eks").create_cluster(
        name="gpu-cluster", roleArn=ROLE, resourcesVpcConfig={"subnetIds": [subnet]}, tags=KIT
    )
    queue = json.dumps({"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}})
    world.client("cloudformation").create_stack(StackName="net-x", TemplateBody=queue, Tags=tags_list(KIT))
    code, doc = run(capsys)
    assert code == 0, doc
    plan = plan_of(doc)
    for rid in ("/training/events", vol, sg, eni, "trainer-images", "gpu-cluster", "net-x"):
        assert plan[rid]["action"] == "delete" and plan[rid]["reason"].startswith(f"kit:project={PREFIX}"), (
            rid
        )
    assert (
        plan["ckpt-archive-42"]["action"] == "keep" and "--delete-data" in plan["ckpt-archive-42"]["reason"]
    )
    assert "/training/other" not in plan and decoy_sg not in plan and vpc not in plan
    assert [s["plan"] for s in doc["steps"] if s["kind"] == "tagged"] == [[]]  # nothing left without a step


def test_a_kit_bucket_in_another_region_is_planned_there_only(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    west = boto3.client("s3", endpoint_url=world.client("s3").meta.endpoint_url, region_name="eu-west-1")
    west.create_bucket(Bucket="kit-west", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    west.put_bucket_tagging(Bucket="kit-west", Tagging={"TagSet": tags_list(KIT)})
    s3 = world.client("s3")
    s3.create_bucket(Bucket="kit-east")
    s3.put_bucket_tagging(Bucket="kit-east", Tagging={"TagSet": tags_list(KIT)})
    code, doc = run(capsys)
    assert code == 0
    assert "kit-east" in plan_of(doc) and "kit-west" not in plan_of(doc)
    code, doc = run(capsys, "--region", "eu-west-1")
    assert code == 0
    assert "kit-west" in plan_of(doc) and "kit-east" not in plan_of(doc)
    # deleting in us-east-1 never touches the other region's bucket
    assert main(["--prefix", PREFIX, "--yes", "--confirm", CONFIRM, "--delete-data", "--only", "s3"]) == 0
    names = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert "kit-west" in names and "kit-east" not in names


def test_the_realism_rules_refuse_as_aws_does(world: World, realistic, fake_aws) -> None:
    """Guards the fake: through the proxy, a subnet or VPC with an ENI and a protected LB are refused."""
    ec2 = boto3.client("ec2", endpoint_url=fake_aws.proxy.url, region_name="us-east-1")
    elbv2 = boto3.client("elbv2", endpoint_url=fake_aws.proxy.url, region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.80.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.80.1.0/24")["Subnet"]["SubnetId"]
    eni = ec2.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"]
    for call in (lambda: ec2.delete_subnet(SubnetId=subnet), lambda: ec2.delete_vpc(VpcId=vpc)):
        with pytest.raises(ec2.exceptions.ClientError, match="DependencyViolation"):
            call()
    lb = elbv2.create_load_balancer(Name="p", Subnets=[subnet])["LoadBalancers"][0]["LoadBalancerArn"]
    elbv2.modify_load_balancer_attributes(
        LoadBalancerArn=lb, Attributes=[{"Key": "deletion_protection.enabled", "Value": "true"}]
    )
    with pytest.raises(elbv2.exceptions.ClientError, match="OperationNotPermitted"):
        elbv2.delete_load_balancer(LoadBalancerArn=lb)
    assert realistic.refusals == {"DeleteSubnet": 1, "DeleteVpc": 1, "DeleteLoadBalancer": 1}
    elbv2.modify_load_balancer_attributes(
        LoadBalancerArn=lb, Attributes=[{"Key": "deletion_protection.enabled", "Value": "false"}]
    )
    elbv2.delete_load_balancer(LoadBalancerArn=lb)
    ec2.delete_network_interface(NetworkInterfaceId=eni)
    ec2.delete_subnet(SubnetId=subnet)
    ec2.delete_vpc(VpcId=vpc)  # nothing uses them any more: AWS (and the fake) delete them
    assert vpc not in world.inventory()["vpc"]


def test_a_kit_tagged_eni_in_use_is_planned_as_kept_with_what_holds_it(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ENI kind lists attached interfaces too: an attached kit ENI is in the plan, kept, with what holds
    it."""
    ec2 = world.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.90.0.0/16")["Vpc"]["VpcId"]  # not the kit's
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.90.1.0/24")["Subnet"]["SubnetId"]
    spec = [{"ResourceType": "network-interface", "Tags": tags_list(KIT)}]
    eni = ec2.create_network_interface(SubnetId=subnet, TagSpecifications=spec)["NetworkInterface"][
        "NetworkInterfaceId"
    ]
    host = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"][0][
        "InstanceId"
    ]
    ec2.attach_network_interface(NetworkInterfaceId=eni, InstanceId=host, DeviceIndex=1)
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "eni")
    assert code == 3, doc
    res = results_by_id(doc)[eni]
    assert res["status"] == "kept" and f"attached to {host}" in res["reason"], res
    assert eni in world.inventory()["eni"]


def test_a_kit_tagged_node_group_in_another_cluster_is_planned_as_kept(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node groups are listed in every cluster, not only the kit's: a kit-tagged one elsewhere is in the plan
    (kept, with the reason)."""
    world.stacks()
    world.eks()
    eks = world.client("eks")
    eks.create_nodegroup(
        clusterName=OTHER_CLUSTER,
        nodegroupName="kit-gpu",
        nodeRole=ROLE,
        subnets=[world.ids["other_subnet"]],
        tags=KIT,
    )
    node = world.client("ec2").run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        SubnetId=world.ids["other_subnet"],
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": tags_list(
                    {**KIT, "eks:cluster-name": OTHER_CLUSTER, "eks:nodegroup-name": "kit-gpu"}
                ),
            }
        ],
    )["Instances"][0]["InstanceId"]
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "nodegroup", "--only", "instance")
    assert code == 3, doc
    res = results_by_id(doc)
    # its node: the group would replace it, so it is kept with the group (it was terminated before)
    assert res[node]["status"] == "kept" and f"node group {OTHER_CLUSTER}/kit-gpu" in res[node]["reason"]
    ours, theirs = res[f"{CLUSTER}/gpu"], res[f"{OTHER_CLUSTER}/kit-gpu"]
    assert ours["status"] == "deleted"
    assert (
        theirs["status"] == "kept"
        and f"in cluster {OTHER_CLUSTER}, which is not the kit's" in theirs["reason"]
    )
    assert f"{OTHER_CLUSTER}/ng" not in res  # not kit-tagged, not in a kit cluster: not the kit's business
    now = world.inventory()["nodegroup"]
    assert {f"{OTHER_CLUSTER}/kit-gpu", f"{OTHER_CLUSTER}/ng"} <= now and f"{CLUSTER}/gpu" not in now


def test_instances_of_an_auto_scaling_group_in_a_kit_stack_are_left_to_the_stack(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Left to the stack step, not kept ("delete the group"): a run that deletes the group's stack then
    exits 0, not 3."""
    ec2 = world.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.95.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.95.1.0/24", AvailabilityZone="us-east-1a")["Subnet"][
        "SubnetId"
    ]
    template = {
        "Resources": {
            "Lt": {
                "Type": "AWS::EC2::LaunchTemplate",
                "Properties": {
                    "LaunchTemplateData": {"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"}
                },
            },
            "Asg": {
                "Type": "AWS::AutoScaling::AutoScalingGroup",
                "Properties": {
                    "MinSize": "1",
                    "MaxSize": "1",
                    "VPCZoneIdentifier": [subnet],
                    "LaunchTemplate": {"LaunchTemplateId": {"Ref": "Lt"}, "Version": "1"},
                    "Tags": [{"Key": "kit:project", "Value": PREFIX, "PropagateAtLaunch": True}],
                },
            },
        }
    }
    world.client("cloudformation").create_stack(
        StackName=f"{PREFIX}-Nodes", TemplateBody=json.dumps(template), Tags=tags_list(KIT)
    )
    member = world.inventory()["instance"]
    assert len(member) == 1
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "instance", "--only", "stack")
    assert code == 0, doc
    assert [s["plan"] for s in doc["steps"] if s["kind"] == "instance"] == [[]]
    assert results_by_id(doc)[f"{PREFIX}-Nodes"]["status"] == "deleted"
