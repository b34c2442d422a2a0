"""Teardown keeps what a user kept: a volume a PersistentVolume retains (or a keep-data tag marks) survives
unless --delete-data, and Kubernetes objects outside the kit's namespaces are never deleted; every kept item
says why. Through moto (the AWS side) and the kubectl stand-in (the cluster side)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ops_world import CLUSTER, KIT, World, tags_list
from test_ops_teardown import CONFIRM, plan_of, results_by_id, run
from test_ops_teardown_units import fake_kubectl

from fsdpkit.k8s.spec import MANAGED_BY
from fsdpkit.ops.teardown import kube
from fsdpkit.ops.teardown.kinds.ebs_volumes import KEEP_DATA_TAG

KIT_NS = {"name": "kit-training", "labels": {kube.MANAGED_BY_LABEL: kube.MANAGED_BY}}
TEAM_NS = {"name": "team-a", "labels": {}}
LABELLED_DEFAULT = {"name": "default", "labels": {kube.MANAGED_BY_LABEL: kube.MANAGED_BY}}


def pvc_volume(world: World, claim: str, namespace: str) -> str:
    """An EBS volume as the EBS CSI driver makes it for a claim of the kit cluster."""
    tags = {
        "kubernetes.io/created-for/pvc/name": claim,
        "kubernetes.io/created-for/pvc/namespace": namespace,
        "ebs.csi.aws.com/cluster": "true",
        f"kubernetes.io/cluster/{CLUSTER}": "owned",
    }
    return world.client("ec2").create_volume(
        AvailabilityZone="us-east-1a",
        Size=10,
        TagSpecifications=[{"ResourceType": "volume", "Tags": tags_list(tags)}],
    )["VolumeId"]


def pv(name: str, volume: str, policy: str, claim_ns: str, claim: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "persistentVolumeReclaimPolicy": policy,
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": volume},
            "claimRef": {"namespace": claim_ns, "name": claim},
        },
    }


@pytest.fixture
def shared_cluster(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[World, Path, Path]:
    """The kit's cluster, shared: a kit namespace and a team's, a retained volume and a plain one."""
    world.stacks()
    world.eks()
    world.ids["retained"] = pvc_volume(world, "ckpt", "kit-training")
    world.ids["scratch"] = pvc_volume(world, "scratch", "kit-training")
    world.ids["teams"] = pvc_volume(world, "db", "team-a")
    server = world.client("eks").describe_cluster(name=CLUSTER)["cluster"]["endpoint"]
    objects = [
        {"kind": "Job", "name": "train", "namespace": "kit-training"},
        {"kind": "PersistentVolumeClaim", "name": "ckpt", "namespace": "kit-training"},
        {"kind": "Job", "name": "etl", "namespace": "team-a"},
        {"kind": "Ingress", "name": "web", "namespace": "team-a"},
        {"kind": "PersistentVolumeClaim", "name": "db", "namespace": "team-a"},
        {"kind": "Job", "name": "notebook", "namespace": "default"},
    ]
    pvs = [
        pv("pv-ckpt", world.ids["retained"], "Retain", "kit-training", "ckpt"),
        pv("pv-scratch", world.ids["scratch"], "Delete", "kit-training", "scratch"),
        pv("pv-db", world.ids["teams"], "Delete", "team-a", "db"),
    ]
    exe, state = fake_kubectl(tmp_path, server, objects, [KIT_NS, TEAM_NS, LABELLED_DEFAULT], pvs)
    monkeypatch.setenv("FAKE_KUBECTL_STATE", str(state))
    return world, exe, state


def volumes(world: World) -> set[str]:
    return world.inventory()["ebs-volume"]


def test_a_retained_volume_and_a_teams_objects_are_kept_with_their_reasons(
    shared_cluster: tuple[World, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    world, exe, state = shared_cluster
    # dry run (the default): the plan says what stays and why, and nothing changes
    code, doc = run(capsys, "--kubectl", str(exe))
    assert code == 0 and doc["executed"] is False
    plan = plan_of(doc)
    retained = plan[world.ids["retained"]]
    assert retained["action"] == "keep"
    assert "pv-ckpt" in retained["reason"] and "Retain" in retained["reason"]
    assert "--delete-data" in retained["reason"]
    assert plan[world.ids["scratch"]]["action"] == "delete"
    assert json.loads(state.read_text())["deleted"] == []

    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--kubectl", str(exe))
    assert code == 3, doc
    res = results_by_id(doc)
    k8s = {r["id"].split(":", 1)[1]: r for r in res.values() if r["id"].startswith(f"{CLUSTER}:")}
    assert sorted(json.loads(state.read_text())["deleted"]) == ["job/train", "persistentvolumeclaim/ckpt"]
    for ref in ("team-a:job/etl", "team-a:ingress/web", "team-a:persistentvolumeclaim/db"):
        assert k8s[ref]["status"] == "kept", ref
        assert "namespace team-a is not the kit's" in k8s[ref]["reason"], k8s[ref]
    assert k8s["default:job/notebook"]["status"] == "kept"
    assert "shared" in k8s["default:job/notebook"]["reason"]
    for key, words in (("retained", "reclaim policy Retain"), ("teams", "outside the kit's namespaces")):
        assert res[world.ids[key]]["status"] == "kept" and words in res[world.ids[key]]["reason"], key
    assert res[world.ids["scratch"]]["status"] == "deleted"
    assert {world.ids["retained"], world.ids["teams"]} <= volumes(world)
    assert world.ids["scratch"] not in volumes(world)
    assert CLUSTER not in world.inventory()["cluster"]

    # the cluster is gone: the volume's own tag, written before it went, still keeps it on a rerun
    tags = {
        t["Key"]: t["Value"]
        for t in world.client("ec2").describe_volumes(VolumeIds=[world.ids["retained"]])["Volumes"][0]["Tags"]
    }
    assert tags[KEEP_DATA_TAG] == "pv-retain" and tags["kit:project"] == KIT["kit:project"]
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--kubectl", str(exe))
    assert code == 3
    rerun = results_by_id(doc)[world.ids["retained"]]
    assert rerun["status"] == "kept" and f"{KEEP_DATA_TAG}=pv-retain" in rerun["reason"]

    # --delete-data: the kept volumes go
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--kubectl", str(exe), "--delete-data")
    assert code == 0, doc
    assert not {world.ids["retained"], world.ids["teams"]} & volumes(world)


def test_a_volume_whose_cluster_cannot_be_read_is_kept_as_data(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without kubectl the reclaim policy is unknown: the volume stays, the reason names the cause."""
    world.stacks()
    world.eks()
    vol = pvc_volume(world, "ckpt", "kit-training")
    code, doc = run(capsys, "--kubectl", "/nonexistent/kubectl", "--only", "ebs-volume")
    assert code == 0
    kept = plan_of(doc)[vol]
    assert kept["action"] == "keep" and "unknown" in kept["reason"] and "not found" in kept["reason"]
    assert "--delete-data" in kept["reason"]  # a confirmed run keeps it the same way (test_ops_teardown)


def test_a_users_keep_data_tag_keeps_a_volume_until_delete_data(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.stacks()
    world.eks()
    vol = pvc_volume(world, "ckpt", "kit-training")
    world.client("ec2").create_tags(Resources=[vol], Tags=[{"Key": KEEP_DATA_TAG, "Value": "mine"}])
    args = ["--yes", "--confirm", CONFIRM, "--only", "ebs-volume"]
    code, doc = run(capsys, *args)
    assert code == 3 and f"tagged {KEEP_DATA_TAG}=mine" in results_by_id(doc)[vol]["reason"]
    code, doc = run(capsys, *args, "--delete-data")
    assert code == 0 and vol not in volumes(world)


@pytest.mark.parametrize(
    ("meta", "kit"),
    [
        ({"name": "kit-training", "labels": {kube.MANAGED_BY_LABEL: kube.MANAGED_BY}}, True),
        ({"name": "kit-training", "labels": {}}, False),
        ({"name": "team-a", "labels": {kube.MANAGED_BY_LABEL: "helm"}}, False),
        ({"name": "default", "labels": {kube.MANAGED_BY_LABEL: kube.MANAGED_BY}}, False),
        ({"name": "kube-system", "labels": {kube.MANAGED_BY_LABEL: kube.MANAGED_BY}}, False),
    ],
)
def test_a_namespace_is_the_kits_by_its_label_never_a_shared_one(meta: dict, kit: bool) -> None:
    assert kube.kit_namespace(meta) is kit


def test_the_label_is_the_one_the_kit_renders_on_its_namespaces() -> None:
    """ops may not import k8s: the two constants must agree, and the namespace template must use the label."""
    assert kube.MANAGED_BY == MANAGED_BY
    template = Path(__file__).resolve().parents[2] / "k8s" / "templates" / "namespace.yaml.j2"
    assert kube.MANAGED_BY_LABEL in template.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("spec", "volume"),
    [
        ({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}, "vol-1"),
        ({"csi": {"driver": "fsx.csi.aws.com", "volumeHandle": "fs-1"}}, None),
        ({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-2"}}, "vol-2"),
        ({"awsElasticBlockStore": {"volumeID": "vol-3"}}, "vol-3"),
        ({}, None),
    ],
)
def test_the_ebs_volume_behind_a_persistent_volume(spec: dict, volume: str | None) -> None:
    assert kube.volume_id({"spec": spec}) == volume
