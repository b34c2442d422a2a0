"""Seed moto with a kit deployment plus untagged / foreign decoys of every kind, and read it back."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREFIX = "Kit1"
CLUSTER = "Kit1-cluster"
OTHER_CLUSTER = "other-cluster"
KIT = {"kit:project": PREFIX}
ROLE = "arn:aws:iam::123456789012:role/eks"


def tags_list(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in d.items()]


NETWORK_TEMPLATE = {
    "Resources": {
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.20.0.0/16"}},
        "Subnet": {
            "Type": "AWS::EC2::Subnet",
            "Properties": {
                "CidrBlock": "10.20.1.0/24",
                "VpcId": {"Ref": "Vpc"},
                "AvailabilityZone": "us-east-1a",
            },
        },
        "NodeSg": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {"GroupDescription": "nodes", "VpcId": {"Ref": "Vpc"}},
        },
    },
    "Outputs": {
        "VpcId": {"Value": {"Ref": "Vpc"}, "Export": {"Name": f"{PREFIX}-vpc"}},
        "SubnetId": {"Value": {"Ref": "Subnet"}, "Export": {"Name": f"{PREFIX}-subnet"}},
    },
}
STORAGE_TEMPLATE = {
    "Resources": {
        "DataSg": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {"GroupDescription": "fsx", "VpcId": {"Fn::ImportValue": f"{PREFIX}-vpc"}},
        }
    }
}


@dataclass
class World:
    client: Callable[[str], Any]
    region: str
    ids: dict[str, str] = field(default_factory=dict)
    """Named handles: 'vpc', 'subnet', 'lb', 'decoy_lb', ..."""

    # -- the kit -------------------------------------------------------------------------------------------
    def stacks(self, *, protect_storage: bool = False) -> None:
        cfn = self.client("cloudformation")
        stack_tags = lambda name: tags_list({**KIT, "kit:stack": name})  # noqa: E731
        cfn.create_stack(
            StackName=f"{PREFIX}-Network",
            TemplateBody=json.dumps(NETWORK_TEMPLATE),
            Tags=stack_tags(f"{PREFIX}-Network"),
        )
        cfn.create_stack(
            EnableTerminationProtection=protect_storage,
            StackName=f"{PREFIX}-Storage",
            TemplateBody=json.dumps(STORAGE_TEMPLATE),
            Tags=stack_tags(f"{PREFIX}-Storage"),
        )
        outputs = {
            o["OutputKey"]: o["OutputValue"]
            for o in cfn.describe_stacks(StackName=f"{PREFIX}-Network")["Stacks"][0]["Outputs"]
        }
        self.ids["vpc"], self.ids["subnet"] = outputs["VpcId"], outputs["SubnetId"]
        ec2 = self.client("ec2")
        sgs = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [self.ids["vpc"]]}])
        self.ids["node_sg"] = next(
            g["GroupId"]
            for g in sgs["SecurityGroups"]
            if g["GroupName"] != "default" and g["Description"] == "nodes"
        )
        # decoys: the prefix without the tag, and a foreign stack
        cfn.create_stack(
            StackName=f"{PREFIX}-Untagged",
            TemplateBody=json.dumps(
                {"Resources": {"V": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.30.0.0/16"}}}}
            ),
        )
        cfn.create_stack(
            StackName="Other-Network",
            TemplateBody=json.dumps(
                {"Resources": {"V": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.40.0.0/16"}}}}
            ),
            Tags=tags_list({"kit:project": "Other"}),
        )
        other = ec2.create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
        self.ids["other_vpc"] = other
        self.ids["other_subnet"] = ec2.create_subnet(VpcId=other, CidrBlock="10.50.1.0/24")["Subnet"][
            "SubnetId"
        ]

    def cluster_stack(self) -> None:
        """The stack that records the cluster's name in its `ClusterName` output, as infra's cluster stack."""
        template = {
            "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
            "Outputs": {"ClusterName": {"Value": CLUSTER}},
        }
        self.client("cloudformation").create_stack(
            StackName=f"{PREFIX}-Cluster",
            TemplateBody=json.dumps(template),
            Tags=tags_list({**KIT, "kit:stack": f"{PREFIX}-Cluster"}),
        )

    def eks(self) -> None:
        eks = self.client("eks")
        vpc_cfg = {"subnetIds": [self.ids["subnet"]]}
        eks.create_cluster(name=CLUSTER, roleArn=ROLE, resourcesVpcConfig=vpc_cfg, tags=KIT)
        eks.create_nodegroup(
            clusterName=CLUSTER, nodegroupName="gpu", nodeRole=ROLE, subnets=[self.ids["subnet"]], tags=KIT
        )
        eks.create_cluster(
            name=OTHER_CLUSTER, roleArn=ROLE, resourcesVpcConfig={"subnetIds": [self.ids["other_subnet"]]}
        )
        eks.create_nodegroup(
            clusterName=OTHER_CLUSTER, nodegroupName="ng", nodeRole=ROLE, subnets=[self.ids["other_subnet"]]
        )

    def controller_leftovers(self, *, untagged_in_kit_vpc: bool = False) -> None:
        """What Kubernetes controllers create outside CloudFormation, plus decoys."""
        ec2, elbv2 = self.client("ec2"), self.client("elbv2")
        vpc, subnet = self.ids["vpc"], self.ids["subnet"]
        ctl = {"elbv2.k8s.aws/cluster": CLUSTER, "service.k8s.aws/stack": "default/web"}
        sg = ec2.create_security_group(
            GroupName="k8s-traffic-web",
            Description="lbc",
            VpcId=vpc,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": tags_list(ctl)}],
        )["GroupId"]
        self.ids["ctl_sg"] = sg
        # the node SG (kit stack) lets the controller's SG in: a reference that blocks deletion on AWS
        ec2.authorize_security_group_ingress(
            GroupId=self.ids["node_sg"],
            IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": 80, "ToPort": 80, "UserIdGroupPairs": [{"GroupId": sg}]}
            ],
        )
        lb = elbv2.create_load_balancer(
            Name="k8s-default-web",
            Subnets=[subnet],
            SecurityGroups=[sg],
            Type="application",
            Tags=tags_list(ctl),
        )["LoadBalancers"][0]
        self.ids["lb"] = lb["LoadBalancerArn"]
        tg = elbv2.create_target_group(
            Name="k8s-default-web", Protocol="HTTP", Port=80, VpcId=vpc, Tags=tags_list(ctl)
        )["TargetGroups"][0]
        self.ids["tg"] = tg["TargetGroupArn"]
        elbv2.create_listener(
            LoadBalancerArn=lb["LoadBalancerArn"],
            Protocol="HTTP",
            Port=80,
            DefaultActions=[{"Type": "forward", "TargetGroupArn": tg["TargetGroupArn"]}],
        )
        pvc = {
            "kubernetes.io/created-for/pvc/name": "data",
            "kubernetes.io/created-for/pvc/namespace": "default",
            "ebs.csi.aws.com/cluster": "true",
            f"kubernetes.io/cluster/{CLUSTER}": "owned",
        }
        self.ids["ebs"] = ec2.create_volume(
            AvailabilityZone="us-east-1a",
            Size=10,
            TagSpecifications=[{"ResourceType": "volume", "Tags": tags_list(pvc)}],
        )["VolumeId"]
        eni_tags = {
            "node.k8s.amazonaws.com/instance_id": "i-0123456789abcdef0",
            "cluster.k8s.amazonaws.com/name": CLUSTER,
        }
        self.ids["eni"] = ec2.create_network_interface(
            SubnetId=subnet,
            Description="aws-K8S-i-0123",
            TagSpecifications=[{"ResourceType": "network-interface", "Tags": tags_list(eni_tags)}],
        )["NetworkInterface"]["NetworkInterfaceId"]
        fsx = self.client("fsx")
        lustre = {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250}
        self.ids["fsx"] = fsx.create_file_system(
            FileSystemType="LUSTRE",
            StorageCapacity=1200,
            SubnetIds=[subnet],
            LustreConfiguration=lustre,
            Tags=tags_list({**KIT, "kit:stack": f"{PREFIX}-Storage"}),
        )["FileSystem"]["FileSystemId"]
        self.ids["fsx_csi"] = fsx.create_file_system(
            FileSystemType="LUSTRE",
            StorageCapacity=1200,
            SubnetIds=[subnet],
            LustreConfiguration={"DeploymentType": "SCRATCH_2"},
            Tags=tags_list({"CSIVolumeName": "pvc-1234"}),
        )["FileSystem"]["FileSystemId"]
        # decoys, outside the kit VPC or for another cluster
        other_vpc, other_subnet = self.ids["other_vpc"], self.ids["other_subnet"]
        other_ctl = {"elbv2.k8s.aws/cluster": OTHER_CLUSTER}
        self.ids["decoy_sg"] = ec2.create_security_group(
            GroupName="other-lbc",
            Description="x",
            VpcId=other_vpc,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": tags_list(other_ctl)}],
        )["GroupId"]
        self.ids["decoy_lb"] = elbv2.create_load_balancer(
            Name="other-lb", Subnets=[other_subnet], Tags=tags_list(other_ctl)
        )["LoadBalancers"][0]["LoadBalancerArn"]
        self.ids["decoy_tg"] = elbv2.create_target_group(
            Name="other-tg", Protocol="HTTP", Port=80, VpcId=other_vpc
        )["TargetGroups"][0]["TargetGroupArn"]
        self.ids["decoy_ebs"] = ec2.create_volume(
            AvailabilityZone="us-east-1a",
            Size=10,
            TagSpecifications=[
                {
                    "ResourceType": "volume",
                    "Tags": tags_list(
                        {
                            "kubernetes.io/created-for/pvc/name": "x",
                            f"kubernetes.io/cluster/{OTHER_CLUSTER}": "owned",
                        }
                    ),
                }
            ],
        )["VolumeId"]
        self.ids["decoy_ebs_plain"] = ec2.create_volume(AvailabilityZone="us-east-1a", Size=5)["VolumeId"]
        self.ids["decoy_eni"] = ec2.create_network_interface(
            SubnetId=other_subnet,
            TagSpecifications=[
                {
                    "ResourceType": "network-interface",
                    "Tags": tags_list({"node.k8s.amazonaws.com/instance_id": "i-1"}),
                }
            ],
        )["NetworkInterface"]["NetworkInterfaceId"]
        self.ids["decoy_fsx"] = fsx.create_file_system(
            FileSystemType="LUSTRE",
            StorageCapacity=1200,
            SubnetIds=[other_subnet],
            LustreConfiguration={"DeploymentType": "SCRATCH_2"},
            Tags=tags_list({"CSIVolumeName": "pvc-other"}),
        )["FileSystem"]["FileSystemId"]
        if untagged_in_kit_vpc:
            self.ids["stray_eni"] = ec2.create_network_interface(SubnetId=subnet, Description="someone's")[
                "NetworkInterface"
            ]["NetworkInterfaceId"]
            self.ids["stray_sg"] = ec2.create_security_group(
                GroupName="someones", Description="x", VpcId=vpc
            )["GroupId"]

    def instances(self) -> None:
        """A p5 started by hand with the kit's tag (no Name, outside any node group), a node of the kit's
        node group, and a decoy outside the kit."""
        ec2 = self.client("ec2")

        def launch(subnet: str, tags: dict[str, str]) -> str:
            spec = [{"ResourceType": "instance", "Tags": tags_list(tags)}] if tags else []
            return ec2.run_instances(
                ImageId="ami-12c6146b",
                MinCount=1,
                MaxCount=1,
                InstanceType="p5.48xlarge",
                SubnetId=subnet,
                TagSpecifications=spec,
            )["Instances"][0]["InstanceId"]

        self.ids["p5"] = launch(self.ids["subnet"], KIT)
        node = {**KIT, "eks:cluster-name": CLUSTER, "eks:nodegroup-name": "gpu"}
        self.ids["node"] = launch(self.ids["subnet"], node)
        self.ids["decoy_instance"] = launch(self.ids["other_subnet"], {})

    def data_and_logs(self) -> None:
        logs, ecr, s3 = self.client("logs"), self.client("ecr"), self.client("s3")
        logs.create_log_group(logGroupName=f"/aws/eks/{CLUSTER}/cluster")
        logs.create_log_group(logGroupName=f"/kit/{PREFIX}/train", tags=KIT)
        logs.create_log_group(logGroupName=f"/aws/eks/{OTHER_CLUSTER}/cluster")
        logs.create_log_group(logGroupName="/random/app")
        repo = ecr.create_repository(repositoryName="kit1/trainer", tags=tags_list(KIT))["repository"]
        ecr.put_image(
            repositoryName=repo["repositoryName"],
            imageTag="v1",
            imageManifest=json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {
                        "mediaType": "application/vnd.docker.container.image.v1+json",
                        "size": 1,
                        "digest": "sha256:" + "a" * 64,
                    },
                    "layers": [],
                }
            ),
        )
        ecr.create_repository(repositoryName="someone/else")
        s3.create_bucket(Bucket="kit1-data")
        s3.put_bucket_tagging(Bucket="kit1-data", Tagging={"TagSet": tags_list(KIT)})
        s3.put_bucket_versioning(Bucket="kit1-data", VersioningConfiguration={"Status": "Enabled"})
        for i in range(3):
            s3.put_object(Bucket="kit1-data", Key=f"ckpt/{i}", Body=b"x")
        s3.delete_object(Bucket="kit1-data", Key="ckpt/0")  # a delete marker and a noncurrent version
        s3.create_bucket(Bucket="someone-elses-data")

    def full(self, **kw: bool) -> World:
        self.stacks()
        self.eks()
        self.controller_leftovers(**kw)
        self.instances()
        self.data_and_logs()
        return self

    # -- reading back --------------------------------------------------------------------------------------
    def inventory(self) -> dict[str, set[str]]:
        """Every id that exists now, per kind (moto state, not through the proxy)."""
        c = self.client
        ec2, elbv2, eks = c("ec2"), c("elbv2"), c("eks")
        stacks = {
            s["StackName"]
            for s in c("cloudformation").describe_stacks()["Stacks"]
            if s["StackStatus"] != "DELETE_COMPLETE"
        }
        return {
            "stack": stacks,
            "cluster": set(eks.list_clusters()["clusters"]),
            "nodegroup": {
                f"{cl}/{ng}"
                for cl in eks.list_clusters()["clusters"]
                for ng in eks.list_nodegroups(clusterName=cl)["nodegroups"]
            },
            "load-balancer": {
                lb["LoadBalancerArn"] for lb in elbv2.describe_load_balancers()["LoadBalancers"]
            },
            "target-group": {tg["TargetGroupArn"] for tg in elbv2.describe_target_groups()["TargetGroups"]},
            "ebs-volume": {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]},
            "eni": {e["NetworkInterfaceId"] for e in ec2.describe_network_interfaces()["NetworkInterfaces"]},
            "security-group": {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]},
            "fsx": {f["FileSystemId"] for f in c("fsx").describe_file_systems()["FileSystems"]},
            "log-group": {g["logGroupName"] for g in c("logs").describe_log_groups()["logGroups"]},
            "ecr": {r["repositoryName"] for r in c("ecr").describe_repositories()["repositories"]},
            "s3": {b["Name"] for b in c("s3").list_buckets()["Buckets"]},
            "vpc": {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]},
            "instance": {
                i["InstanceId"]
                for r in ec2.describe_instances()["Reservations"]
                for i in r["Instances"]
                if i["State"]["Name"] != "terminated"
            },
        }

    def decoys(self) -> dict[str, set[str]]:
        """The decoys seeded above, per kind: none of them may ever be deleted."""
        i = self.ids
        return {
            "stack": {f"{PREFIX}-Untagged", "Other-Network"},
            "cluster": {OTHER_CLUSTER},
            "nodegroup": {f"{OTHER_CLUSTER}/ng"},
            "load-balancer": {i["decoy_lb"]},
            "target-group": {i["decoy_tg"]},
            "ebs-volume": {i["decoy_ebs"], i["decoy_ebs_plain"]},
            "eni": {i["decoy_eni"], *([i["stray_eni"]] if "stray_eni" in i else [])},
            "security-group": {i["decoy_sg"], *([i["stray_sg"]] if "stray_sg" in i else [])},
            "fsx": {i["decoy_fsx"]},
            "log-group": {f"/aws/eks/{OTHER_CLUSTER}/cluster", "/random/app"},
            "ecr": {"someone/else"},
            "s3": {"someone-elses-data"},
            "vpc": {i["other_vpc"]},
            "instance": {i["decoy_instance"]} if "decoy_instance" in i else set(),
        }

    def owned(self) -> dict[str, set[str]]:
        i = self.ids
        return {
            "stack": {f"{PREFIX}-Network", f"{PREFIX}-Storage"},
            "cluster": {CLUSTER},
            "nodegroup": {f"{CLUSTER}/gpu"},
            "load-balancer": {i["lb"]},
            "target-group": {i["tg"]},
            "ebs-volume": {i["ebs"]},
            "eni": {i["eni"]},
            "security-group": {i["ctl_sg"]},
            "fsx": {i["fsx"], i["fsx_csi"]},
            "log-group": {f"/aws/eks/{CLUSTER}/cluster", f"/kit/{PREFIX}/train"},
            "ecr": {"kit1/trainer"},
            "instance": {i["p5"], i["node"]} if "p5" in i else set(),
        }
