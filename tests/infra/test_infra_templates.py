"""Targeted facts about the synthesized templates; they survive snapshot updates.

cdk-nag's EKS rules do not fire on aws_eks_v2, so endpoint access and control-plane logs are checked here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsdpkit.infra.constructs.gpu_nodegroup import GPU_NODE_LABELS, GPU_TAINT
from fsdpkit.infra.instances import GPU_INSTANCES
from fsdpkit.infra.stacks.cluster_stack import OUTPUT_KEYS
from tests.infra.conftest import VARIANTS, Synth, only, resources

ALL = list(VARIANTS)


def gpu_launch_template(synth: Synth, variant: str) -> dict[str, Any]:
    return only(
        synth.template(variant, "cluster"),
        "AWS::EC2::LaunchTemplate",
        lambda p: "NetworkInterfaces" in p["LaunchTemplateData"],
    )["LaunchTemplateData"]


def subnet_az(synth: Synth, variant: str, ref: dict[str, Any]) -> str:
    """Follow a cross-stack subnet reference into the network stack and return the subnet's AZ."""
    network = synth.template(variant, "network")
    output = ref["Fn::GetStackOutput"]["OutputName"]
    logical_id = network["Outputs"][output]["Value"]["Ref"]
    return network["Resources"][logical_id]["Properties"]["AvailabilityZone"]


def efa_sg_ref(synth: Synth, variant: str) -> dict[str, Any]:
    """The cluster stack's reference to the network stack's EFA security group."""
    network = synth.template(variant, "network")
    (sg_id,) = [
        k
        for k, v in resources(network, "AWS::EC2::SecurityGroup").items()
        if v["Properties"]["GroupDescription"].startswith("EFA")
    ]
    (output,) = [k for k, v in network["Outputs"].items() if v["Value"] == {"Fn::GetAtt": [sg_id, "GroupId"]}]
    return {
        "Fn::GetStackOutput": {
            "StackName": f"{synth.configs[variant].prefix}-network",
            "Region": synth.configs[variant].region,
            "OutputName": output,
        }
    }


# --- GPU launch template ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_one_efa_interface_per_network_card(synth: Synth, variant: str) -> None:
    cfg = synth.configs[variant]
    cards = GPU_INSTANCES[cfg.gpu.instance_type].network_cards
    nics = gpu_launch_template(synth, variant)["NetworkInterfaces"]
    efa = [n for n in nics if n["InterfaceType"] in ("efa", "efa-only")]
    assert len(efa) == cards
    assert sorted(n["NetworkCardIndex"] for n in efa) == list(range(cards))
    assert {n["DeviceIndex"] for n in nics} <= {0, 1}
    assert all("SubnetId" not in n for n in nics), "managed node groups choose the subnet"


@pytest.mark.parametrize(
    ("variant", "layout", "entries"), [("default", "efa-only", 33), ("block", "legacy", 32)]
)
def test_p5_has_32_efa_interfaces_in_both_layouts(
    synth: Synth, variant: str, layout: str, entries: int
) -> None:
    assert synth.configs[variant].gpu.instance_type == "p5.48xlarge"
    assert synth.configs[variant].gpu.efa_layout == layout
    nics = gpu_launch_template(synth, variant)["NetworkInterfaces"]
    assert len(nics) == entries
    efa = [n for n in nics if n["InterfaceType"] in ("efa", "efa-only")]
    assert len(efa) == 32
    assert len({n["NetworkCardIndex"] for n in efa}) == 32
    expected_primary_type = "interface" if layout == "efa-only" else "efa"
    assert nics[0]["InterfaceType"] == expected_primary_type


@pytest.mark.parametrize("variant", ALL)
def test_security_groups_sit_on_the_interfaces_not_the_template(synth: Synth, variant: str) -> None:
    data = gpu_launch_template(synth, variant)
    assert "SecurityGroupIds" not in data
    assert "SecurityGroups" not in data
    cluster_sg = {
        "Fn::GetAtt": [
            next(iter(resources(synth.template(variant, "cluster"), "AWS::EKS::Cluster"))),
            "ClusterSecurityGroupId",
        ]
    }
    efa_sg = efa_sg_ref(synth, variant)
    primary, *others = data["NetworkInterfaces"]
    assert (primary["NetworkCardIndex"], primary["DeviceIndex"]) == (0, 0)
    assert primary["Groups"] == [cluster_sg, efa_sg], "nodes cannot join without the cluster security group"
    assert all(n["Groups"] == [efa_sg] for n in others)


@pytest.mark.parametrize("variant", ALL)
def test_imdsv2_required_on_every_node_template(synth: Synth, variant: str) -> None:
    templates = resources(synth.template(variant, "cluster"), "AWS::EC2::LaunchTemplate").values()
    assert len(templates) == 2
    for lt in templates:
        options = lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]
        assert options["HttpTokens"] == "required"
        assert options["HttpPutResponseHopLimit"] == 1, "pods must not reach the node role through IMDS"


def test_capacity_block_market_options(synth: Synth) -> None:
    data = gpu_launch_template(synth, "block")
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert data["InstanceType"] == "p5.48xlarge"
    assert "Placement" not in data
    nodegroup = only(synth.template("block", "cluster"), "AWS::EKS::Nodegroup", lambda p: "Taints" in p)
    assert nodegroup["CapacityType"] == "CAPACITY_BLOCK"
    assert "InstanceTypes" not in nodegroup, "Capacity Blocks need the instance type in the launch template"
    assert nodegroup["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 4}


def test_odcr_targets_the_reservation_without_market_options(synth: Synth) -> None:
    data = gpu_launch_template(synth, "odcr")
    assert "InstanceMarketOptions" not in data
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
        "CapacityReservationId": "cr-0fedcba9876543210"
    }
    nodegroup = only(synth.template("odcr", "cluster"), "AWS::EKS::Nodegroup", lambda p: "Taints" in p)
    assert nodegroup["CapacityType"] == "ON_DEMAND"


def test_on_demand_default_has_no_reservation_or_placement(synth: Synth) -> None:
    data = gpu_launch_template(synth, "default")
    assert not {"InstanceMarketOptions", "CapacityReservationSpecification", "Placement"} & set(data)
    assert resources(synth.template("default", "cluster"), "AWS::EC2::PlacementGroup") == {}


def test_placement_group_only_when_asked(synth: Synth) -> None:
    template = synth.template("placed", "cluster")
    (group_id, group), *_ = resources(template, "AWS::EC2::PlacementGroup").items()
    assert group["Properties"]["Strategy"] == "cluster"
    assert gpu_launch_template(synth, "placed")["Placement"] == {"GroupName": {"Ref": group_id}}


@pytest.mark.parametrize("variant", ALL)
def test_gpu_root_volume_and_nvme_raid0(synth: Synth, variant: str) -> None:
    data = gpu_launch_template(synth, variant)
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True
    assert root["Ebs"]["VolumeType"] == "gp3"
    user_data = data["UserData"]["Fn::Base64"]
    assert "Content-Type: application/node.eks.aws" in user_data
    assert "strategy: RAID0" in user_data


# --- node groups ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_gpu_node_group_ami_labels_taint_repair(synth: Synth, variant: str) -> None:
    nodegroup = only(synth.template(variant, "cluster"), "AWS::EKS::Nodegroup", lambda p: "Taints" in p)
    assert nodegroup["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert nodegroup["Labels"] == GPU_NODE_LABELS
    key, rest = GPU_TAINT.split("=")
    value, _ = rest.split(":")
    assert nodegroup["Taints"] == [{"Key": key, "Value": value, "Effect": "NO_SCHEDULE"}]
    repair = nodegroup["NodeRepairConfig"]
    assert (repair["Enabled"], repair["MaxParallelNodesRepairedCount"]) == (True, 1)
    assert repair["MaxUnhealthyNodeThresholdCount"] == synth.configs[variant].gpu.repair_max_unhealthy_nodes
    assert len(nodegroup["Subnets"]) == 1
    assert subnet_az(synth, variant, nodegroup["Subnets"][0]) == synth.configs[variant].gpu.availability_zone


def test_system_node_group_runs_untainted_across_azs(synth: Synth) -> None:
    nodegroup = only(synth.template("default", "cluster"), "AWS::EKS::Nodegroup", lambda p: "Taints" not in p)
    assert nodegroup["AmiType"] == "AL2023_x86_64_STANDARD"
    assert nodegroup["Labels"] == {"role": "system"}
    assert nodegroup["ScalingConfig"] == {"MinSize": 2, "DesiredSize": 2, "MaxSize": 4}
    assert len(nodegroup["Subnets"]) == 2


# --- network -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_efa_security_group_self_rules_and_no_default_egress(synth: Synth, variant: str) -> None:
    network = synth.template(variant, "network")
    sg_id = next(
        k
        for k, v in resources(network, "AWS::EC2::SecurityGroup").items()
        if v["Properties"]["GroupDescription"].startswith("EFA")
    )
    me = {"Fn::GetAtt": [sg_id, "GroupId"]}
    assert "SecurityGroupEgress" not in network["Resources"][sg_id]["Properties"]
    ingress = [r["Properties"] for r in resources(network, "AWS::EC2::SecurityGroupIngress").values()]
    egress = [r["Properties"] for r in resources(network, "AWS::EC2::SecurityGroupEgress").values()]
    assert {"GroupId": me, "SourceSecurityGroupId": me, "IpProtocol": "-1"}.items() <= ingress[0].items()
    assert {"GroupId": me, "DestinationSecurityGroupId": me, "IpProtocol": "-1"}.items() <= egress[0].items()


def test_vpc_spans_the_configured_azs_with_private_subnets(synth: Synth) -> None:
    network = synth.template("default", "network")
    subnets = [r["Properties"] for r in resources(network, "AWS::EC2::Subnet").values()]
    private = [s for s in subnets if s["MapPublicIpOnLaunch"] is False]
    assert sorted(s["AvailabilityZone"] for s in private) == ["us-west-2a", "us-west-2b"]
    assert {s["CidrBlock"].split("/")[1] for s in private} == {"18"}
    assert len(resources(network, "AWS::EC2::FlowLog")) == 1


# --- storage -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_fsx_sits_in_the_gpu_subnet_and_is_kept(synth: Synth, variant: str) -> None:
    storage = synth.template(variant, "storage")
    (fs,) = resources(storage, "AWS::FSx::FileSystem").values()
    assert fs["DeletionPolicy"] == "Retain"
    props = fs["Properties"]
    assert len(props["SubnetIds"]) == 1
    assert subnet_az(synth, variant, props["SubnetIds"][0]) == synth.configs[variant].gpu.availability_zone
    nodegroup = only(synth.template(variant, "cluster"), "AWS::EKS::Nodegroup", lambda p: "Taints" in p)
    assert props["SubnetIds"] == nodegroup["Subnets"]
    lustre = props["LustreConfiguration"]
    assert lustre["DeploymentType"] == synth.configs[variant].storage.deployment_type
    assert lustre["DataCompressionType"] == "LZ4"
    assert props["FileSystemTypeVersion"] == "2.15"
    assert props["StorageCapacity"] == synth.configs[variant].storage.storage_gib


def test_fsx_clients_reach_lustre_ports_through_the_efa_group(synth: Synth) -> None:
    storage = synth.template("default", "storage")
    efa_sg = efa_sg_ref(synth, "default")
    ingress = [r["Properties"] for r in resources(storage, "AWS::EC2::SecurityGroupIngress").values()]
    egress = [r["Properties"] for r in resources(storage, "AWS::EC2::SecurityGroupEgress").values()]
    assert any(
        r["SourceSecurityGroupId"] == efa_sg and (r["FromPort"], r["ToPort"]) == (988, 1023) for r in ingress
    )
    assert any(r["GroupId"] == efa_sg and (r["FromPort"], r["ToPort"]) == (988, 1023) for r in egress)


def test_persistent_2_links_s3_through_one_association(synth: Synth) -> None:
    assert resources(synth.template("default", "storage"), "AWS::FSx::DataRepositoryAssociation") == {}
    (dra,) = resources(synth.template("block", "storage"), "AWS::FSx::DataRepositoryAssociation").values()
    props = dra["Properties"]
    assert props["DataRepositoryPath"] == "s3://kit-training-data/"
    assert props["FileSystemPath"] == "/data"
    assert props["BatchImportMetaDataOnCreate"] is True
    assert props["S3"]["AutoImportPolicy"]["Events"] == ["NEW", "CHANGED", "DELETED"]
    assert props["S3"]["AutoExportPolicy"]["Events"] == ["NEW", "CHANGED", "DELETED"]


def test_persistent_1_links_s3_by_import_path(synth: Synth) -> None:
    (fs,) = resources(synth.template("odcr", "storage"), "AWS::FSx::FileSystem").values()
    lustre = fs["Properties"]["LustreConfiguration"]
    assert lustre["ImportPath"] == "s3://kit-training-data"
    assert lustre["PerUnitStorageThroughput"] == 200


# --- encryption, endpoint, logging -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_encryption_at_rest_everywhere(synth: Synth, variant: str) -> None:
    cluster_t = synth.template(variant, "cluster")
    cluster = only(cluster_t, "AWS::EKS::Cluster")
    (encryption,) = cluster["EncryptionConfig"]
    assert encryption["Resources"] == ["secrets"]
    key_id = encryption["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert cluster_t["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    storage = synth.template(variant, "storage")
    (fs,) = resources(storage, "AWS::FSx::FileSystem").values()
    if synth.configs[variant].storage.deployment_type.startswith("PERSISTENT"):
        key_ref = fs["Properties"]["KmsKeyId"]["Ref"]
        assert storage["Resources"][key_ref]["Properties"]["EnableKeyRotation"] is True
    repo = only(synth.template(variant, "registry"), "AWS::ECR::Repository")
    assert repo["EncryptionConfiguration"] == {"EncryptionType": "KMS"}
    network = synth.template(variant, "network")
    (flow_logs,) = resources(network, "AWS::Logs::LogGroup").values()
    key_id = flow_logs["Properties"]["KmsKeyId"]["Fn::GetAtt"][0]
    assert network["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    assert repo["ImageTagMutability"] == "IMMUTABLE"  # a re-push never changes what a tag runs
    assert repo["ImageScanningConfiguration"] == {"ScanOnPush": True}


@pytest.mark.parametrize(
    ("variant", "public", "private", "cidrs"),
    [
        ("default", False, True, None),
        ("block", False, True, None),
        ("grouped", True, True, ["198.51.100.0/24"]),
        ("odcr", True, True, ["203.0.113.0/24"]),
        ("placed", False, True, None),
    ],
)
def test_endpoint_access(
    synth: Synth, variant: str, public: bool, private: bool, cidrs: list[str] | None
) -> None:
    vpc_config = only(synth.template(variant, "cluster"), "AWS::EKS::Cluster")["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is public
    assert vpc_config["EndpointPrivateAccess"] is private
    assert vpc_config.get("PublicAccessCidrs") == cidrs


@pytest.mark.parametrize("variant", ALL)
def test_control_plane_logs_and_no_auto_mode(synth: Synth, variant: str) -> None:
    cluster = only(synth.template(variant, "cluster"), "AWS::EKS::Cluster")
    assert cluster["Logging"]["ClusterLogging"]["EnabledTypes"] == [
        {"Type": "api"},
        {"Type": "audit"},
        {"Type": "authenticator"},
    ]
    assert cluster["ComputeConfig"] == {"Enabled": False}
    assert cluster["Version"] == synth.configs[variant].cluster.kubernetes_version


def test_admin_access_entries(synth: Synth) -> None:
    entries = [
        r["Properties"]
        for r in resources(synth.template("block", "cluster"), "AWS::EKS::AccessEntry").values()
    ]
    (admin,) = [e for e in entries if e["PrincipalArn"] == "arn:aws:iam::111111111111:role/Admin"]
    assert admin["AccessPolicies"][0]["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(admin["AccessPolicies"][0]["PolicyArn"])


# --- add-ons and Kubernetes objects --------------------------------------------------------------------


EXPECTED_ADDONS = {
    "vpc-cni",
    "kube-proxy",
    "coredns",
    "eks-pod-identity-agent",
    "aws-fsx-csi-driver",
    "eks-node-monitoring-agent",
    "amazon-cloudwatch-observability",
}


def test_addons_with_pod_identity(synth: Synth) -> None:
    template = synth.template("default", "cluster")
    addons = {r["Properties"]["AddonName"]: r for r in resources(template, "AWS::EKS::Addon").values()}
    assert set(addons) == EXPECTED_ADDONS
    fsx = addons["aws-fsx-csi-driver"]["Properties"]
    assert fsx["PodIdentityAssociations"][0]["ServiceAccount"] == "fsx-csi-controller-sa"
    assert "ConfigurationValues" not in fsx, "the chart's node DaemonSet tolerates every taint already"
    role_id = fsx["PodIdentityAssociations"][0]["RoleArn"]["Fn::GetAtt"][0]
    trust = template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(trust["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    cw = addons["amazon-cloudwatch-observability"]["Properties"]
    assert cw["PodIdentityAssociations"][0]["ServiceAccount"] == "cloudwatch-agent"
    system_ng = next(
        k for k, v in resources(template, "AWS::EKS::Nodegroup").items() if "Taints" not in v["Properties"]
    )
    for name in ("coredns", "aws-fsx-csi-driver", "amazon-cloudwatch-observability"):
        assert system_ng in addons[name]["DependsOn"], f"{name} runs a Deployment and needs the system nodes"


def test_device_plugins_are_pinned_and_tolerate_the_gpu_taint(synth: Synth) -> None:
    charts = {
        r["Properties"]["Chart"]: r["Properties"]
        for r in resources(synth.template("default", "cluster"), "Custom::AWSCDK-EKS-HelmChart").values()
    }
    assert {c: p["Version"] for c, p in charts.items()} == {
        "nvidia-device-plugin": synth.configs["default"].kubernetes.nvidia_device_plugin_version,
        "aws-efa-k8s-device-plugin": synth.configs["default"].kubernetes.efa_device_plugin_version,
    }
    for props in charts.values():
        values = json.loads(props["Values"])
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values[
            "tolerations"
        ]
    efa_values = json.loads(charts["aws-efa-k8s-device-plugin"]["Values"])
    assert efa_values["supportedInstanceLabels"] == {
        "keys": ["vpc.amazonaws.com/efa.present"],
        "values": ["true"],
    }


def test_fsx_pv_and_pvc_follow_the_file_system(synth: Synth) -> None:
    (manifest,) = resources(
        synth.template("placed", "cluster"), "Custom::AWSCDK-EKS-KubernetesResource"
    ).values()
    text = json.dumps(manifest["Properties"]["Manifest"])
    assert "fsx.csi.aws.com" in text
    assert '\\"namespace\\":\\"training\\"' in text
    assert "4800Gi" in text
    # the namespace is the kit's to teardown: it deletes Kubernetes objects only in namespaces with this label
    namespace = text.split('\\"kind\\":\\"PersistentVolume\\"')[0]
    assert '\\"kind\\":\\"Namespace\\"' in namespace
    assert '\\"app.kubernetes.io/managed-by\\":\\"kit\\"' in namespace


def test_kubectl_lambdas_run_in_the_vpc_with_a_private_endpoint(synth: Synth) -> None:
    template = synth.template("placed", "cluster")
    cluster_id = next(iter(resources(template, "AWS::EKS::Cluster")))
    functions = resources(template, "AWS::Lambda::Function").values()
    assert len(functions) == 2
    for function in functions:
        vpc_config = function["Properties"]["VpcConfig"]
        assert vpc_config["SecurityGroupIds"] == [{"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}]
        assert len(vpc_config["SubnetIds"]) == 2


@pytest.mark.parametrize("variant", ["block", "odcr"])
def test_no_lambdas_without_kubernetes_objects(synth: Synth, variant: str) -> None:
    template = synth.template(variant, "cluster")
    assert resources(template, "AWS::Lambda::Function") == {}
    assert [r["Type"] for r in template["Resources"].values() if r["Type"].startswith("Custom::")] == []


# --- outputs (contract 2) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_contract_outputs(synth: Synth, variant: str) -> None:
    cfg = synth.configs[variant]
    outputs = synth.template(variant, "cluster")["Outputs"]
    assert set(OUTPUT_KEYS) <= set(outputs)
    assert json.loads(outputs["GpuNodeLabels"]["Value"]) == GPU_NODE_LABELS
    assert outputs["GpuNodeTaint"]["Value"] == "nvidia.com/gpu=true:NoSchedule"
    assert outputs["GpuInstanceType"]["Value"] == cfg.gpu.instance_type
    assert outputs["GpuNodeCount"]["Value"] == str(cfg.gpu.effective_desired_nodes)
    assert outputs["Region"]["Value"] == cfg.region
    assert outputs["EfaDevicesPerNode"]["Value"] == str(GPU_INSTANCES[cfg.gpu.instance_type].efa_devices)
    assert outputs["KubernetesObjectsByCdk"]["Value"] == str(cfg.kubernetes.deploy_objects).lower()
    assert ("FsxPvcName" in outputs) is cfg.kubernetes.deploy_objects
    uri = json.dumps(outputs["EcrRepositoryUri"]["Value"])
    assert f"{cfg.account}.dkr.ecr.{cfg.region}." in uri
    assert f"/{cfg.prefix}/trainer" in uri
