"""Pieces of teardown that need no AWS: shared filters, S3 batching, tag keys; and the kubectl step."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ops_world import CLUSTER, PREFIX, World
from test_ops_teardown import CONFIRM, run

from fsdpkit.ops.tags import PROJECT_TAG, STACK_TAG
from fsdpkit.ops.teardown.filters import plan
from fsdpkit.ops.teardown.kinds.s3 import MAX_DELETE_BATCH, batches
from fsdpkit.ops.teardown.kinds.tagging import parse_arn
from fsdpkit.ops.teardown.model import Options, Resource, Scope

SCOPE = Scope(
    prefix=PREFIX,
    region="us-east-1",
    account="1",
    clusters=(CLUSTER,),
    vpcs=("vpc-1",),
    subnets=("subnet-1",),
    options=Options(),
)


def decide(**kw) -> tuple[str, str]:
    d = plan([Resource(kind="x", id="i", **kw)], SCOPE)[0]
    return d.action, d.reason


@pytest.mark.parametrize(
    ("tags", "detail", "action", "why"),
    [
        ({PROJECT_TAG: PREFIX}, {}, "delete", f"{PROJECT_TAG}={PREFIX}"),
        ({PROJECT_TAG: "Other"}, {}, "keep", "not owned"),
        ({}, {}, "keep", "not owned"),
        ({"elbv2.k8s.aws/cluster": CLUSTER}, {}, "delete", f"elbv2.k8s.aws/cluster={CLUSTER}"),
        ({f"kubernetes.io/cluster/{CLUSTER}": "shared"}, {}, "keep", "not owned"),  # shared is not ownership
        ({"node.k8s.amazonaws.com/instance_id": "i-1"}, {"vpc_id": "vpc-1"}, "delete", "VPC CNI"),
        ({"node.k8s.amazonaws.com/instance_id": "i-1"}, {"vpc_id": "vpc-2"}, "keep", "not owned"),
        ({"CSIVolumeName": "pvc-1"}, {"subnet_ids": ("subnet-1",)}, "delete", "FSx CSI"),
        ({}, {"log_group_of": CLUSTER}, "delete", "log group of kit cluster"),
        ({}, {"log_group_of": "someone"}, "keep", "not owned"),
        # exclude beats include: the kit's own tag does not override a protection
        ({PROJECT_TAG: PREFIX, "kit:teardown": "keep"}, {}, "keep", "kit:teardown=keep"),
        (
            {PROJECT_TAG: PREFIX},
            {"protected": "termination protection is on"},
            "keep",
            "termination protection",
        ),
        ({PROJECT_TAG: PREFIX}, {"is_data": True}, "keep", "--delete-data"),
    ],
)
def test_shared_filters(tags: dict, detail: dict, action: str, why: str) -> None:
    got_action, reason = decide(tags=tags, detail=detail)
    assert got_action == action and why in reason


def test_data_goes_only_with_delete_data() -> None:
    scope = Scope(prefix=PREFIX, region="r", account="1", options=Options(delete_data=True))
    r = Resource(kind="s3", id="b", tags={PROJECT_TAG: PREFIX}, detail={"is_data": True})
    assert plan([r], scope)[0].action == "delete"


def test_s3_batches_respect_the_1000_key_limit() -> None:
    keys = [{"Key": str(i)} for i in range(2500)]
    assert [len(b) for b in batches(keys)] == [1000, 1000, 500]
    with pytest.raises(ValueError, match=r"1\.\.1000 keys, got 1001"):
        batches(keys, MAX_DELETE_BATCH + 1)


def test_tag_keys_match_infra() -> None:
    """ops duplicates infra/tags.py (ops may not import infra); the two must agree."""
    infra_tags = Path(__file__).resolve().parents[2] / "infra" / "tags.py"
    if not infra_tags.exists():
        pytest.skip("infra/tags.py not present")
    ns: dict = {}
    exec(compile(infra_tags.read_text(), str(infra_tags), "exec"), ns)
    assert (ns["PROJECT_TAG"], ns["STACK_TAG"]) == (PROJECT_TAG, STACK_TAG)


KIT_NAMESPACE = {"name": "kit-training", "labels": {"app.kubernetes.io/managed-by": "kit"}}


def fake_kubectl(
    tmp_path: Path,
    server: str,
    objects: list[dict],
    namespaces: Sequence[dict] = (KIT_NAMESPACE,),
    pvs: Sequence[dict] = (),
) -> tuple[Path, Path]:
    state = tmp_path / "kubectl.json"
    doc = {"server": server, "objects": objects, "namespaces": list(namespaces), "pvs": list(pvs)}
    state.write_text(json.dumps({**doc, "deleted": [], "calls": []}))
    exe = tmp_path / "kubectl"
    script = Path(__file__).parent / "fixtures" / "fake_kubectl.py"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    exe.chmod(0o755)
    return exe, state


def test_kubernetes_objects_go_first_through_kubectl(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.stacks()
    world.eks()
    server = world.client("eks").describe_cluster(name=CLUSTER)["cluster"]["endpoint"]
    objects = [
        {"kind": "Job", "name": "train", "namespace": "kit-training"},
        {"kind": "Service", "name": "web", "namespace": "kit-training", "spec": {"type": "LoadBalancer"}},
        {"kind": "Service", "name": "kube-dns", "namespace": "kube-system", "spec": {"type": "ClusterIP"}},
        {"kind": "PersistentVolumeClaim", "name": "data", "namespace": "kit-training"},
    ]
    exe, state = fake_kubectl(tmp_path, server, objects)
    monkeypatch.setenv("FAKE_KUBECTL_STATE", str(state))
    code, doc = run(
        capsys, "--yes", "--confirm", CONFIRM, "--only", "k8s", "--only", "nodegroup", "--kubectl", str(exe)
    )
    assert code == 0, doc
    st = json.loads(state.read_text())
    assert sorted(st["deleted"]) == ["job/train", "persistentvolumeclaim/data", "service/web"]
    first_delete = next(i for i, c in enumerate(st["calls"]) if "delete" in c)
    assert all("--context" in c for c in st["calls"][first_delete:])
    assert f"{CLUSTER}/gpu" not in world.inventory()["nodegroup"]


def test_without_kubectl_the_kubernetes_step_is_skipped_with_a_reason(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.stacks()
    world.eks()
    code, doc = run(capsys, "--kubectl", os.path.join("/nonexistent", "kubectl"))
    assert code == 0
    k8s = next(s for s in doc["steps"] if s["kind"] == "k8s")
    assert k8s["note"].startswith("skipped:") and "not found" in k8s["note"] and not k8s["error"]


@pytest.mark.parametrize(
    ("arn", "rtype", "rid"),
    [
        ("arn:aws:ec2:us-east-1:1:vpc/vpc-1", "ec2:vpc", "vpc-1"),
        ("arn:aws:s3:::my-bucket", "s3:bucket", "my-bucket"),
        ("arn:aws:logs:us-east-1:1:log-group:/aws/eks/c/cluster:*", "logs:log-group", "/aws/eks/c/cluster"),
        ("arn:aws:fsx:us-east-1:1:backup/backup-1", "fsx:backup", "backup-1"),
        (
            "arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/app/web/abc",
            "elasticloadbalancing:loadbalancer",
            "arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/app/web/abc",
        ),
        ("arn:aws:eks:us-east-1:1:nodegroup/c/gpu/uuid", "eks:nodegroup", "c/gpu"),
        (
            "arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/legacy",
            "elasticloadbalancing:classic-loadbalancer",
            "arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/legacy",
        ),
        ("arn:aws:sns:us-east-1:1:alerts", "sns:topic", "arn:aws:sns:us-east-1:1:alerts"),
        ("arn:aws:ec2:us-east-1:1:launch-template/lt-1", "ec2:launch-template", "lt-1"),
    ],
)
def test_tagging_arns_map_to_the_ids_each_service_uses(arn: str, rtype: str, rid: str) -> None:
    assert parse_arn(arn) == (rtype, rid)


GONE = datetime(2026, 6, 1, tzinfo=UTC)
FORMER = Scope(
    prefix=PREFIX,
    region="us-east-1",
    account="1",
    former_clusters=(CLUSTER,),
    former_deleted_at={CLUSTER: GONE},
    vpcs=("vpc-1",),
)


@pytest.mark.parametrize(
    ("detail", "action"),
    [
        ({"created": GONE - timedelta(days=3)}, "delete"),  # made while the name was the kit's
        ({"created": GONE + timedelta(seconds=1)}, "keep"),  # made by a later cluster of that name
        ({"vpc_id": "vpc-1"}, "delete"),  # no creation time: in a kit VPC
        ({"vpc_id": "vpc-9"}, "keep"),  # no creation time, elsewhere: no evidence
    ],
)
def test_a_former_cluster_name_is_evidence_only_before_its_stack_was_deleted(
    detail: dict, action: str
) -> None:
    r = Resource(kind="x", id="i", tags={f"kubernetes.io/cluster/{CLUSTER}": "owned"}, detail=detail)
    assert plan([r], FORMER)[0].action == action
    unbounded = Scope(prefix=PREFIX, region="us-east-1", account="1", former_clusters=(CLUSTER,))
    assert plan([r], unbounded)[0].action == "delete"  # no deletion time known: the name alone counts
