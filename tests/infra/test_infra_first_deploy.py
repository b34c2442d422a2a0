"""What a first real deploy needs, each asserted on the synthesized templates or the pure rules."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsonschema
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx

from fsdpkit.infra import references, sizing
from fsdpkit.infra.config import ClusterConfig, load_config
from fsdpkit.infra.constructs.addons import (
    CLOUDWATCH_CONFIGURATION,
    CLOUDWATCH_DEFAULT_AGENT_CONFIG,
    CLOUDWATCH_DROPPED_DEFAULTS,
)
from fsdpkit.infra.constructs.device_plugins import efa_plugin_repository
from fsdpkit.infra.constructs.fsx_volume import MANAGED_BY, MANAGED_BY_LABEL
from fsdpkit.infra.constructs.gpu_nodegroup import REFERENCES_TAG
from fsdpkit.infra.constructs.storage import LUSTRE_CLIENT_PORTS
from fsdpkit.infra.errors import ConfigError
from fsdpkit.infra.kubernetes_versions import SUPPORT, newest_in_standard_support, support_notice
from fsdpkit.infra.notices import capacity_line, synth_notices
from fsdpkit.infra.stacks import build_kit
from tests.infra.conftest import REPO, VARIANTS, Synth, cdk_context, only, resources

ALL = list(VARIANTS)
SCHEMAS = Path(__file__).parent / "fixtures" / "addon_schemas"
CFN_SCHEMAS = Path(jsonschema.__file__).parents[1] / "cfnlint" / "data" / "schemas"


def gpu_nodegroup(synth: Synth, variant: str) -> dict[str, Any]:
    return only(synth.template(variant, "cluster"), "AWS::EKS::Nodegroup", lambda p: "Taints" in p)


def gpu_lt(synth: Synth, variant: str) -> dict[str, Any]:
    return only(
        synth.template(variant, "cluster"),
        "AWS::EC2::LaunchTemplate",
        lambda p: "NetworkInterfaces" in p["LaunchTemplateData"],
    )


def addons(synth: Synth, variant: str) -> dict[str, dict[str, Any]]:
    template = synth.template(variant, "cluster")
    return {
        r["Properties"]["AddonName"]: r["Properties"] for r in resources(template, "AWS::EKS::Addon").values()
    }


def sg_id(template: dict[str, Any], description_start: str) -> str:
    (found,) = [
        k
        for k, v in resources(template, "AWS::EC2::SecurityGroup").items()
        if v["Properties"]["GroupDescription"].startswith(description_start)
    ]
    return found


# --- capacity ------------------------------------------------------------------------------------------


def test_default_gpu_group_starts_empty_and_nothing_waits_for_gpu_nodes(synth: Synth) -> None:
    template = synth.template("default", "cluster")
    assert gpu_nodegroup(synth, "default")["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}
    (gpu_id,) = [
        k for k, v in resources(template, "AWS::EKS::Nodegroup").items() if "Taints" in v["Properties"]
    ]
    waiting = [k for k, v in template["Resources"].items() if gpu_id in v.get("DependsOn", [])]
    assert waiting == [], "a GPU launch failure must not hold up add-ons, plugins or the PV"
    assert template["Outputs"]["GpuNodeCount"]["Value"] == "0"


def test_odcr_without_desired_count_starts_empty(synth: Synth) -> None:
    """An ODCR may be short, inactive or elsewhere; a node group that cannot fill rolls back the stack."""
    assert gpu_nodegroup(synth, "grouped")["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 3}
    assert synth.template("grouped", "cluster")["Outputs"]["GpuNodeCount"]["Value"] == "0"


def test_synth_says_what_gpu_capacity_the_user_gets() -> None:
    cfg = load_config(cdk_context())
    assert capacity_line(cfg) == (
        "gpu: 0 x p5.48xlarge (default; max 2, on demand, no reservation); cluster, FSx and ECR deploy "
        "either way; start nodes with -c gpu.desired_nodes=N"
    )
    scaled = load_config({**cdk_context(), "gpu.desired_nodes": "2"})
    assert capacity_line(scaled).startswith("gpu: 2 x p5.48xlarge (set; max 2")
    assert synth_notices(cfg, dt.date(2026, 12, 1)) == [capacity_line(cfg)]
    odcr = load_config(
        {**cdk_context(), "gpu.capacity": "odcr", "gpu.reservation_id": "cr-0123456789abcdef0"}
    )
    assert capacity_line(odcr) == (
        "gpu: 0 x p5.48xlarge (default; max 2, from the On-Demand Capacity Reservation); cluster, FSx and "
        "ECR deploy either way; start nodes with -c gpu.desired_nodes=N (N at most the reservation's "
        "instance count, once it is active in gpu.availability_zone)"
    )


# --- add-on configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_addon_configuration_uses_only_published_schema_keys(synth: Synth, variant: str) -> None:
    configured = {n: p for n, p in addons(synth, variant).items() if "ConfigurationValues" in p}
    assert set(configured) == {"amazon-cloudwatch-observability", "vpc-cni"}
    for name, props in configured.items():
        schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
        jsonschema.validate(json.loads(props["ConfigurationValues"]), schema)


@pytest.mark.parametrize("variant", ALL)
def test_the_cluster_enforces_network_policy(synth: Synth, variant: str) -> None:
    """vpc-cni's network policy agent is on (else a run's NetworkPolicy is an object nothing enforces), in the
    default standard mode: strict would deny every new pod of a shared cluster that has no policy."""
    cni = json.loads(addons(synth, variant)["vpc-cni"]["ConfigurationValues"])
    assert cni == {"enableNetworkPolicy": "true"}
    assert "NETWORK_POLICY_ENFORCING_MODE" not in json.dumps(cni)


def test_the_claims_namespace_carries_the_label_teardown_deletes_by() -> None:
    """Teardown deletes Kubernetes objects only in namespaces labelled as the kit's (ops/teardown/kube.py)."""
    from fsdpkit.k8s.spec import MANAGED_BY as RENDERED

    assert (MANAGED_BY_LABEL, MANAGED_BY) == ("app.kubernetes.io/managed-by", RENDERED)


def _cloudwatch_agent_schema() -> dict[str, Any]:
    return json.loads((SCHEMAS / "cloudwatch-agent-config.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("variant", ALL)
def test_cloudwatch_agent_config_keys_follow_the_agents_documented_structure(
    synth: Synth, variant: str
) -> None:
    """`agent.config` is free-form in the add-on schema; the agent ignores keys it does not know."""
    cw = json.loads(addons(synth, variant)["amazon-cloudwatch-observability"]["ConfigurationValues"])
    jsonschema.validate(cw["agent"]["config"], _cloudwatch_agent_schema())


def test_cloudwatch_agent_schema_catches_a_misspelt_kubernetes_key() -> None:
    typo = {"logs": {"metrics_collected": {"kubernetes": {"accelerated_compute_metric": False}}}}
    with pytest.raises(jsonschema.ValidationError, match="'accelerated_compute_metric' was unexpected"):
        jsonschema.validate(typo, _cloudwatch_agent_schema())
    misplaced = {"logs": {"kubernetes": {"accelerated_compute_metrics": False}}}
    with pytest.raises(jsonschema.ValidationError, match="'kubernetes' was unexpected"):
        jsonschema.validate(misplaced, _cloudwatch_agent_schema())


def _leaf_paths(tree: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the leaves (non-dict values and empty dicts) of a nested dict."""
    paths: set[str] = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        paths |= _leaf_paths(value, f"{path}.") if isinstance(value, dict) and value else {path}
    return paths


def test_what_replacing_the_cloudwatch_default_config_drops_is_documented() -> None:
    kit = _leaf_paths(CLOUDWATCH_CONFIGURATION["agent"]["config"])
    default = _leaf_paths(CLOUDWATCH_DEFAULT_AGENT_CONFIG)
    assert default - kit == set(CLOUDWATCH_DROPPED_DEFAULTS)
    doc = (REPO / "docs" / "infra.md").read_text(encoding="utf-8")
    assert "replaces the agent's default" in doc
    for path in CLOUDWATCH_DROPPED_DEFAULTS:
        assert f"`{path}`" in doc


def test_one_dcgm_on_the_gpu_nodes(synth: Synth) -> None:
    cw = json.loads(addons(synth, "default")["amazon-cloudwatch-observability"]["ConfigurationValues"])
    kubernetes = cw["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]
    assert kubernetes["accelerated_compute_metrics"] is False
    assert "eks-node-monitoring-agent" in addons(synth, "default")


# --- stale cross-stack references ---------------------------------------------------------------------


def _fsx_digest(deployment_type: str, capacity: int) -> str:
    stack = cdk.Stack(cdk.App(), "Storage")
    fs = fsx.CfnFileSystem(
        stack,
        "Fs",
        file_system_type="LUSTRE",
        subnet_ids=["subnet-1"],
        storage_capacity=capacity,
        lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(deployment_type=deployment_type),
    )
    return references.digest(references.replacing_inputs(fs))


def test_digest_follows_replacing_properties_only() -> None:
    base = _fsx_digest("PERSISTENT_2", 2400)
    assert _fsx_digest("PERSISTENT_2", 4800) == base, "a resize updates in place; no PV churn"
    assert _fsx_digest("PERSISTENT_1", 2400) != base, "a new deployment type replaces the file system"


def _cascade_digest(*, group_description: str = "fsx", subnet_cidr: str = "10.0.0.0/24") -> str:
    """Digest of a file system whose security group and subnet live in its own stack."""
    stack = cdk.Stack(cdk.App(), "Storage")
    vpc = ec2.CfnVPC(stack, "Vpc", cidr_block="10.0.0.0/16")
    subnet = ec2.CfnSubnet(stack, "Subnet", vpc_id=vpc.ref, cidr_block=subnet_cidr)
    group = ec2.CfnSecurityGroup(stack, "Group", group_description=group_description, vpc_id=vpc.ref)
    fs = fsx.CfnFileSystem(
        stack,
        "Fs",
        file_system_type="LUSTRE",
        subnet_ids=[subnet.ref],
        security_group_ids=[group.attr_group_id],
        storage_capacity=2400,
    )
    return references.digest(references.replacing_inputs(fs))


def test_digest_follows_replacements_that_cascade_within_the_stack() -> None:
    base = _cascade_digest()
    assert _cascade_digest(group_description="fsx v2") != base, "a new group replaces the file system"
    assert _cascade_digest(subnet_cidr="10.0.1.0/24") != base, "a new subnet replaces the file system"
    assert _cascade_digest() == base


@pytest.mark.parametrize("variant", ["default", "grouped"])
def test_cluster_lustre_callback_rules_carry_the_fsx_group_digest(synth: Synth, variant: str) -> None:
    # Computed on an unsynthesized copy, as the app does: synth later rewrites cross-stack values.
    fresh = build_kit(cdk.App(context=cdk_context()), synth.configs[variant])
    group = fresh.storage.storage.file_system.connections.security_groups[0]
    expected = references.digest(references.replacing_inputs(group.node.default_child))
    template = synth.template(variant, "cluster")
    rules = [
        r["Properties"]
        for k, r in resources(template, "AWS::EC2::SecurityGroupIngress").items()
        if k.startswith("LustreCallbacks")
    ]
    assert len(rules) == len(LUSTRE_CLIENT_PORTS)
    assert {r["Description"] for r in rules} == {f"Lustre server callbacks to clients (fsx-sg {expected})"}


@pytest.mark.parametrize("type_name", sorted(references.REPLACING_PROPERTIES))
def test_replacing_properties_cover_the_cloudformation_schema(type_name: str) -> None:
    index = json.loads((CFN_SCHEMAS / "providers" / "us-east-1.json").read_text(encoding="utf-8"))
    schema = json.loads((CFN_SCHEMAS / "resources" / f"{index[type_name]}.json").read_text(encoding="utf-8"))
    create_only = {p.removeprefix("/properties/") for p in schema["createOnlyProperties"]}
    assert create_only <= set(references.REPLACING_PROPERTIES[type_name])


@pytest.mark.parametrize("variant", ALL)
def test_consumers_carry_the_reference_digests(synth: Synth, variant: str) -> None:
    cluster = synth.template(variant, "cluster")
    digests = dict(p.split("=") for p in cluster["Outputs"]["ReferencesDigest"]["Value"].split(","))
    assert set(digests) == {"efa-sg", "fsx"}
    tags = gpu_lt(synth, variant)["TagSpecifications"][0]["Tags"]
    assert {"Key": REFERENCES_TAG, "Value": digests["efa-sg"]} in tags
    if synth.configs[variant].kubernetes.deploy_objects:
        assert cluster["Outputs"]["FsxPvcName"]["Value"] == f"fsx-claim-{digests['fsx']}"
        (manifest,) = resources(cluster, "Custom::AWSCDK-EKS-KubernetesResource").values()
        assert f"fsx-pv-{digests['fsx']}" in json.dumps(manifest["Properties"]["Manifest"])


def test_an_efa_enabled_file_system_changes_the_fsx_digest(synth: Synth) -> None:
    def fsx_digest(variant: str) -> str:
        value = synth.template(variant, "cluster")["Outputs"]["ReferencesDigest"]["Value"]
        return value.split("fsx=")[1]

    assert fsx_digest("default") != fsx_digest("grouped")


# --- Kubernetes version --------------------------------------------------------------------------------


def test_default_version_is_the_newest_in_standard_support() -> None:
    drivable = ("1.34", "1.35", "1.36")  # the installed kubectl v35 layer's skew
    assert ClusterConfig().kubernetes_version == newest_in_standard_support(dt.date(2026, 12, 1), drivable)
    assert newest_in_standard_support(dt.date(2026, 12, 1), tuple(SUPPORT)) == "1.37"


def test_version_support_notices() -> None:
    assert support_notice("1.36", dt.date(2026, 12, 1)) is None
    assert support_notice("1.34", dt.date(2026, 12, 1)) == (
        "cluster.kubernetes_version=1.34: EKS standard support ends on 2026-12-02; after that extended "
        "support costs 6x the cluster-hour price; plan the upgrade"
    )
    assert support_notice("1.34", dt.date(2026, 12, 3)).startswith(  # type: ignore[union-attr]
        "cluster.kubernetes_version=1.34: EKS standard support ended on 2026-12-02;"
    )


def test_kubernetes_1_37_is_accepted_without_kubectl_objects() -> None:
    cfg = load_config(
        {**cdk_context(), "cluster.kubernetes_version": "1.37", "kubernetes.deploy_objects": "false"}
    )
    assert cfg.cluster.kubernetes_version == "1.37"


# --- Lustre client rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_lustre_callbacks_reach_every_client_group(synth: Synth, variant: str) -> None:
    storage = synth.template(variant, "storage")
    fsx_sg = {"Fn::GetAtt": [sg_id(storage, f"{synth.configs[variant].prefix}-storage"), "GroupId"]}
    ingress = [r["Properties"] for r in resources(storage, "AWS::EC2::SecurityGroupIngress").values()]
    efa_rules = {
        (r["FromPort"], r["ToPort"])
        for r in ingress
        if r["SourceSecurityGroupId"] == fsx_sg and "Fn::GetStackOutput" in r["GroupId"]
    }
    assert efa_rules == set(LUSTRE_CLIENT_PORTS) == {(988, 988), (1018, 1023)}
    cluster = synth.template(variant, "cluster")
    cluster_id = next(iter(resources(cluster, "AWS::EKS::Cluster")))
    rules = [r["Properties"] for r in resources(cluster, "AWS::EC2::SecurityGroupIngress").values()]
    on_cluster_sg = {
        (r["FromPort"], r["ToPort"])
        for r in rules
        if r["GroupId"] == {"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}
        and "Fn::GetStackOutput" in r["SourceSecurityGroupId"]
    }
    assert on_cluster_sg == {(988, 988), (1018, 1023)}


# --- FSx -------------------------------------------------------------------------------------------------


def test_default_fsx_writes_the_default_checkpoint_in_time() -> None:
    cfg = load_config(cdk_context())
    fs_mbps = sizing.fsx_mbps(cfg.storage.storage_gib, cfg.storage.effective_throughput_per_tib or 0)
    gb = sizing.checkpoint_gb(sizing.DEFAULT_MODEL_PARAMS)
    assert cfg.storage.checkpoint_gb >= gb
    assert sizing.write_seconds(checkpoint_gb=gb, fs_mbps=fs_mbps, nodes=cfg.gpu.max_nodes) < 60
    old = sizing.write_seconds(checkpoint_gb=gb, fs_mbps=sizing.fsx_mbps(1200, 250), nodes=2)
    assert old > 300, "the old default needed over five minutes per checkpoint"


@pytest.mark.parametrize("variant", ALL)
def test_fsx_metadata_logging_and_efa(synth: Synth, variant: str) -> None:
    cfg = synth.configs[variant].storage
    (fs,) = resources(synth.template(variant, "storage"), "AWS::FSx::FileSystem").values()
    lustre = fs["Properties"]["LustreConfiguration"]
    assert lustre["LogConfiguration"] == {"Level": "WARN_ERROR"}
    if cfg.deployment_type == "PERSISTENT_2":
        assert lustre["MetadataConfiguration"] == {"Mode": "AUTOMATIC"}
    assert lustre.get("EfaEnabled", False) is cfg.efa_enabled
    groups = fs["Properties"]["SecurityGroupIds"]
    assert len(groups) == (2 if cfg.efa_enabled else 1)
    if cfg.efa_enabled:
        network = f"{synth.configs[variant].prefix}-network"
        assert groups[1]["Fn::GetStackOutput"]["StackName"] == network, "the EFA group joins the file system"


def _group_of(synth: Synth, variant: str, stack: str, group_id: dict[str, Any]) -> tuple[str, str]:
    """(stack, logical id) of the security group a `GroupId` value names, through a weak reference too."""
    if "Fn::GetStackOutput" in group_id:
        ref = group_id["Fn::GetStackOutput"]
        producer = ref["StackName"].removeprefix(f"{synth.configs[variant].prefix}-")
        value = synth.template(variant, producer)["Outputs"][ref["OutputName"]]["Value"]
        return _group_of(synth, variant, producer, value)
    return stack, group_id["Fn::GetAtt"][0]


def _all_traffic_rules(synth: Synth, variant: str, kind: str, peer: str) -> set[tuple[str, str, str]]:
    """(stack, group, peer group) of every all-protocol `kind` (Ingress/Egress) rule in network, storage."""
    found = set()
    for stack in ("network", "storage"):
        for rule in resources(synth.template(variant, stack), f"AWS::EC2::SecurityGroup{kind}").values():
            props = rule["Properties"]
            if props["IpProtocol"] == "-1" and peer in props:
                owner = _group_of(synth, variant, stack, props["GroupId"])
                found.add((*owner, _group_of(synth, variant, stack, props[peer])[1]))
    return found


@pytest.mark.parametrize("variant", [v for v in ALL if VARIANTS[v].get("storage.efa_enabled") == "true"])
def test_every_group_of_an_efa_file_system_allows_all_traffic_within_itself(
    synth: Synth, variant: str
) -> None:
    """FSx guide, EFA-enabled file systems: their security groups allow all inbound and outbound traffic
    within the group (https://docs.aws.amazon.com/fsx/latest/LustreGuide/efa-file-systems.html)."""
    template = synth.template(variant, "storage")
    (fs,) = resources(template, "AWS::FSx::FileSystem").values()
    groups = [_group_of(synth, variant, "storage", g) for g in fs["Properties"]["SecurityGroupIds"]]
    ingress = _all_traffic_rules(synth, variant, "Ingress", "SourceSecurityGroupId")
    egress = _all_traffic_rules(synth, variant, "Egress", "DestinationSecurityGroupId")
    for stack, group in groups:
        assert (stack, group, group) in ingress, f"{group} lets not all traffic in from itself"
        inline = synth.template(variant, stack)["Resources"][group]["Properties"].get(
            "SecurityGroupEgress", []
        )
        open_egress = {"CidrIp": "0.0.0.0/0", "IpProtocol": "-1"}
        assert (stack, group, group) in egress or any(open_egress.items() <= e.items() for e in inline), group


def test_default_fsx_size_and_throughput(synth: Synth) -> None:
    (fs,) = resources(synth.template("default", "storage"), "AWS::FSx::FileSystem").values()
    assert fs["Properties"]["StorageCapacity"] == 2400
    assert fs["Properties"]["LustreConfiguration"]["PerUnitStorageThroughput"] == 1000


# --- node repair -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "overrides", "threshold"),
    [
        ("default", [("AcceleratedHardwareReady", "DCGMError", "NoAction", 10)], 1),
        ("grouped", [("AcceleratedHardwareReady", "NvidiaXID79Error", "Replace", 15)], 2),
    ],
)
def test_node_repair_overrides_and_threshold(
    synth: Synth, variant: str, overrides: list[tuple[str, str, str, int]], threshold: int
) -> None:
    repair = gpu_nodegroup(synth, variant)["NodeRepairConfig"]
    assert repair["MaxUnhealthyNodeThresholdCount"] == threshold
    assert [
        (
            o["NodeMonitoringCondition"],
            o["NodeUnhealthyReason"],
            o["RepairAction"],
            o["MinRepairWaitTimeMins"],
        )
        for o in repair["NodeRepairConfigOverrides"]
    ] == overrides


# --- device plugins, pod IPs ------------------------------------------------------------------------------


def test_device_plugin_values(synth: Synth) -> None:
    charts = {
        r["Properties"]["Chart"]: json.loads(r["Properties"]["Values"])
        for r in resources(synth.template("default", "cluster"), "Custom::AWSCDK-EKS-HelmChart").values()
    }
    nvidia = charts["nvidia-device-plugin"]
    assert (nvidia["gdrcopyEnabled"], nvidia["mofedEnabled"]) == (True, False)
    repo = charts["aws-efa-k8s-device-plugin"]["image"]["repository"]
    assert repo == "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin"


def test_efa_plugin_chart_in_another_region_pulls_from_that_regions_registry(synth: Synth) -> None:
    assert synth.configs["placed"].region == "ap-southeast-3"
    charts = {
        r["Properties"]["Chart"]: json.loads(r["Properties"].get("Values", "{}"))  # jobset: no values
        for r in resources(synth.template("placed", "cluster"), "Custom::AWSCDK-EKS-HelmChart").values()
    }
    repo = charts["aws-efa-k8s-device-plugin"]["image"]["repository"]
    assert repo == "296578399912.dkr.ecr.ap-southeast-3.amazonaws.com/eks/aws-efa-k8s-device-plugin"


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("eu-west-1", "602401143452.dkr.ecr.eu-west-1.amazonaws.com"),
        ("af-south-1", "877085696533.dkr.ecr.af-south-1.amazonaws.com"),
        ("cn-north-1", "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_efa_plugin_image_follows_the_region(region: str, registry: str) -> None:
    assert efa_plugin_repository(region) == f"{registry}/eks/aws-efa-k8s-device-plugin"


def test_efa_plugin_image_refuses_a_region_outside_the_table() -> None:
    with pytest.raises(ConfigError, match=r"^region: 'ap-east-2' has no EKS image registry account"):
        efa_plugin_repository("ap-east-2")


@pytest.mark.parametrize(
    ("variant", "pods"), [("default", 51), ("block", 100), ("placed", 149), ("grouped", 250)]
)
def test_gpu_nodes_advertise_only_addressable_pods(synth: Synth, variant: str, pods: int) -> None:
    user_data = gpu_lt(synth, variant)["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    assert f"maxPods: {pods}" in user_data


# --- least privilege ---------------------------------------------------------------------------------


def _policy_names(role: dict[str, Any]) -> set[str]:
    return {
        json.dumps(arn).rsplit("/", 1)[-1].rstrip('"]}')
        for arn in role["Properties"].get("ManagedPolicyArns", [])
    }


@pytest.mark.parametrize("variant", ALL)
def test_node_roles_have_ssm_and_no_cni_policy(synth: Synth, variant: str) -> None:
    template = synth.template(variant, "cluster")
    node_roles = [
        r
        for r in resources(template, "AWS::IAM::Role").values()
        if r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
        == {"Service": "ec2.amazonaws.com"}
    ]
    assert len(node_roles) == 2
    for role in node_roles:
        assert _policy_names(role) == {
            "AmazonEKSWorkerNodePolicy",
            "AmazonEC2ContainerRegistryReadOnly",
            "AmazonSSMManagedInstanceCore",
        }
    cni = addons(synth, variant)["vpc-cni"]
    (association,) = cni["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "aws-node"
    cni_role = template["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]
    assert _policy_names(cni_role) == {"AmazonEKS_CNI_Policy"}


def test_fsx_csi_controller_cannot_delete_the_file_system(synth: Synth) -> None:
    template = synth.template("default", "cluster")
    (association,) = addons(synth, "default")["aws-fsx-csi-driver"]["PodIdentityAssociations"]
    role_id = association["RoleArn"]["Fn::GetAtt"][0]
    assert "ManagedPolicyArns" not in template["Resources"][role_id]["Properties"]
    actions = [
        a
        for p in resources(template, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    ]
    assert actions == ["fsx:DescribeFileSystems"]


# --- capacity options ------------------------------------------------------------------------------------


def test_reservation_resource_group_inside_an_existing_placement_group(synth: Synth) -> None:
    data = gpu_lt(synth, "grouped")["LaunchTemplateData"]
    group = "arn:aws:resource-groups:us-west-2:111111111111:group/gpu-odcrs"
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationResourceGroupArn": group}
    }
    assert data["Placement"] == {"GroupName": "my-cluster-pg"}
    assert resources(synth.template("grouped", "cluster"), "AWS::EC2::PlacementGroup") == {}
    assert gpu_nodegroup(synth, "grouped")["CapacityType"] == "ON_DEMAND"


def test_docs_say_next_to_make_deploy_that_jobs_and_teardown_need_the_tunnel() -> None:
    doc = (REPO / "docs" / "infra.md").read_text(encoding="utf-8")
    deploy = doc.index("and `make deploy`: it deploys the four stacks")
    nearby = doc[deploy : deploy + 1200]
    for needed in ("SSM", "`make train-job`", "`make teardown`", "cluster.endpoint_access=private"):
        assert needed in nearby, needed
