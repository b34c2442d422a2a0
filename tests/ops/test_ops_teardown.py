"""Teardown end to end against moto over HTTP: plan, confirmation, deletion order, decoys, reruns."""

from __future__ import annotations

import json

import pytest
from ops_world import CLUSTER, PREFIX, World

from fsdpkit.ops.teardown.__main__ import main

FAST = ["--poll-interval", "0.01", "--backoff", "0.01", "--timeout", "20"]
CONFIRM = f"{PREFIX}/123456789012"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    # a flag given twice is refused, so a test's own --timeout replaces the fast default
    pairs = zip(FAST[::2], FAST[1::2], strict=True)
    fast = [x for flag, value in pairs if flag not in args for x in (flag, value)]
    code = main(["--prefix", PREFIX, "--json", *fast, *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_dry_run_plans_owned_and_changes_nothing(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.full()
    before = world.inventory()
    code, doc = run(capsys)
    assert code == 0
    assert doc["executed"] is False
    assert doc["clusters"] == [CLUSTER] and doc["vpcs"] == [world.ids["vpc"]]
    planned = {(s["kind"], p["id"]) for s in doc["steps"] for p in s["plan"] if p["action"] == "delete"}
    node = world.ids["node"]  # its node group still exists: it goes with it, after which it is swept
    ebs = world.ids["ebs"]  # no kubeconfig context for the cluster: its PV's reclaim policy is unknown
    for kind, ids in world.owned().items():
        for i in ids - {node, ebs}:
            assert (kind, i) in planned, (kind, i)
    assert plan_of(doc)[node]["action"] == "keep"
    assert plan_of(doc)[node]["reason"] == f"a node of node group {CLUSTER}/gpu: it goes with the node group"
    assert plan_of(doc)[ebs]["action"] == "keep"
    assert plan_of(doc)[ebs]["reason"].startswith("the reclaim policy of its PersistentVolume is unknown")
    for kind, ids in world.decoys().items():
        for i in ids:
            assert (kind, i) not in planned, (kind, i)
    assert world.inventory() == before


def plan_of(doc: dict) -> dict[str, dict]:
    return {p["id"]: p for s in doc["steps"] for p in s["plan"]}


def deleted_ids(doc: dict) -> set[tuple[str, str]]:
    return {
        (s["kind"], r["id"]) for s in doc["steps"] for r in s["results"] if r["status"] in ("deleted", "gone")
    }


def results_by_id(doc: dict) -> dict[str, dict]:
    return {r["id"]: r for s in doc["steps"] for r in s["results"]}


def assert_decoys_survive(world: World) -> None:
    now = world.inventory()
    for kind, ids in world.decoys().items():
        assert ids <= now[kind], (kind, ids - now[kind])


def test_confirmed_run_deletes_owned_keeps_decoys_and_data_then_rerun_is_noop(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code == 3, doc  # finished, but the data bucket and the claim's volume were kept on purpose
    now = world.inventory()
    ebs = world.ids["ebs"]  # its cluster could not be read: the PV's reclaim policy is unknown, so it stays
    for kind, ids in world.owned().items():
        assert not (ids - {ebs}) & now[kind], (kind, ids & now[kind])
    assert_decoys_survive(world)
    assert "kit1-data" in now["s3"] and ebs in now["ebs-volume"]
    for rid in ("kit1-data", ebs):
        kept = results_by_id(doc)[rid]
        assert kept["status"] == "kept" and "--delete-data" in kept["reason"], kept
    assert world.ids["vpc"] not in now["vpc"]  # the network stack went last, with its VPC
    # second run: nothing is deleted, the kept bucket is reported again
    code2, doc2 = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code2 == 3
    assert deleted_ids(doc2) == set()
    assert world.inventory() == now


def test_order_follows_the_registry(world: World, fake_aws, capsys: pytest.CaptureFixture[str]) -> None:
    world.full()
    code, _ = run(capsys, "--yes", "--confirm", CONFIRM)
    assert code == 3
    log = fake_aws.proxy.log

    def first(pred) -> int:
        return next(i for i, r in enumerate(log) if pred(r))

    ng = first(lambda r: r.method == "DELETE" and "/node-groups/" in r.path)
    cluster = first(lambda r: r.method == "DELETE" and r.path.rstrip("/").endswith(f"/clusters/{CLUSTER}"))
    lb = first(lambda r: r.action == "DeleteLoadBalancer")
    tg = first(lambda r: r.action == "DeleteTargetGroup")
    eni = first(lambda r: r.action == "DeleteNetworkInterface")
    sg = first(lambda r: r.action == "DeleteSecurityGroup")
    storage = first(lambda r: r.action == "DeleteStack" and "Storage" in r.params.get("StackName", ""))
    network = first(lambda r: r.action == "DeleteStack" and "Network" in r.params.get("StackName", ""))
    assert ng < cluster < lb < tg < eni < sg < storage < network


def test_wrong_confirmation_deletes_nothing(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.full()
    before = world.inventory()
    code = main(["--prefix", PREFIX, *FAST, "--yes", "--confirm", f"{PREFIX}/999999999999"])
    err = capsys.readouterr().err
    assert code == 2
    assert "does not match" in err and "nothing was deleted" in err
    assert world.inventory() == before


def test_yes_without_confirmation_off_a_terminal_deletes_nothing(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    before = world.inventory()
    assert main(["--prefix", PREFIX, *FAST, "--yes"]) == 2
    assert "--confirm" in capsys.readouterr().err
    assert world.inventory() == before


def test_delete_data_empties_versioned_bucket_and_exits_ok(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--delete-data")
    assert code == 0, doc
    assert "kit1-data" not in world.inventory()["s3"]
    assert_decoys_survive(world)
    # everything is gone: a rerun changes nothing and says so (exit 5, one line)
    now = world.inventory()
    assert main(["--prefix", PREFIX, *FAST, "--yes", "--confirm", CONFIRM, "--delete-data"]) == 5
    assert "already torn down" in capsys.readouterr().err
    assert world.inventory() == now


def test_untagged_things_in_the_kit_vpc_are_kept_with_a_reason(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full(untagged_in_kit_vpc=True)
    code, doc = run(
        capsys, "--yes", "--confirm", CONFIRM, "--delete-data", "--only", "eni", "--only", "security-group"
    )
    assert code == 3
    res = results_by_id(doc)
    for key in ("stray_eni", "stray_sg"):
        assert res[world.ids[key]]["status"] == "kept"
        assert res[world.ids[key]]["reason"].startswith("not owned")
    assert res[world.ids["eni"]]["status"] == "deleted"
    assert_decoys_survive(world)


def test_protection_tag_and_deletion_protection_are_respected(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    world.client("ecr").tag_resource(
        resourceArn=world.client("ecr").describe_repositories(repositoryNames=["kit1/trainer"])[
            "repositories"
        ][0]["repositoryArn"],
        tags=[{"Key": "kit:teardown", "Value": "keep"}],
    )
    world.client("elbv2").modify_load_balancer_attributes(
        LoadBalancerArn=world.ids["lb"], Attributes=[{"Key": "deletion_protection.enabled", "Value": "true"}]
    )
    code, doc = run(capsys, "--yes", "--confirm", CONFIRM, "--only", "ecr", "--only", "load-balancer")
    assert code == 3
    res = results_by_id(doc)
    assert res["kit1/trainer"]["status"] == "kept" and "kit:teardown=keep" in res["kit1/trainer"]["reason"]
    assert (
        res[world.ids["lb"]]["status"] == "kept" and "deletion protection" in res[world.ids["lb"]]["reason"]
    )
    now = world.inventory()
    assert "kit1/trainer" in now["ecr"] and world.ids["lb"] in now["load-balancer"]


@pytest.mark.parametrize("flag", ["--fsx-backup", "--no-fsx-backup"])
def test_fsx_final_backup_for_persistent_by_default_and_never_for_scratch(
    flag: str, world: World, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    world.full()
    args = ["--yes", "--confirm", CONFIRM, "--only", "fsx"]
    code, _ = run(capsys, *args, *([flag] if flag == "--no-fsx-backup" else []))
    assert code == 0
    sent = {r.params["FileSystemId"]: r.params for r in fake_aws.proxy.log if r.action == "DeleteFileSystem"}
    persistent = sent[world.ids["fsx"]]["LustreConfiguration"]
    assert persistent["SkipFinalBackup"] is (flag == "--no-fsx-backup")
    if flag == "--fsx-backup":
        assert {"Key": "kit:project", "Value": PREFIX} in persistent["FinalBackupTags"]
    assert sent[world.ids["fsx_csi"]]["LustreConfiguration"]["SkipFinalBackup"] is True  # SCRATCH: none
    assert world.ids["decoy_fsx"] not in sent


def test_a_kit_stack_resource_counts_even_without_its_tag(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ownership also comes from the stacks' resources: a VPC whose tag was lost is still the kit's."""
    world.full(untagged_in_kit_vpc=True)
    ec2 = world.client("ec2")
    ec2.delete_tags(Resources=[world.ids["vpc"]], Tags=[{"Key": "kit:project"}])
    vpc_tags = ec2.describe_vpcs(VpcIds=[world.ids["vpc"]])["Vpcs"][0].get("Tags", [])
    assert "kit:project" not in {t["Key"] for t in vpc_tags}
    code, doc = run(capsys)
    assert code == 0
    assert doc["vpcs"] == [world.ids["vpc"]]
    eni = next(s for s in doc["steps"] if s["kind"] == "eni")
    assert {p["id"]: p["action"] for p in eni["plan"]} == {
        world.ids["eni"]: "delete",
        world.ids["stray_eni"]: "keep",
    }
