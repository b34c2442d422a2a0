# ruff: noqa: E501  (exact commands and messages, one per line)
"""`make train-job` for KIND=jobset and KIND=trainjob: apply, follow, status and delete through a stand-in
kubectl on PATH (the boundary) that serves the CRDs named in $FAKE_CRDS and answers like a cluster running the
JobSet and Trainer controllers. The kubectl calls are asserted in order: the CRD check comes before anything is
applied, and delete removes the top object before the rest."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.k8s.test_k8s_cli import run_cli

JOBSET_CRD = "jobsets.jobset.x-k8s.io"
TRAINJOB_CRD = "trainjobs.trainer.kubeflow.org"
RUNTIME_CRD = "clustertrainingruntimes.trainer.kubeflow.org"
ALL_CRDS = f"{JOBSET_CRD},{TRAINJOB_CRD},{RUNTIME_CRD}"
CRD_QUERY = ["get", "crd", TRAINJOB_CRD, JOBSET_CRD, RUNTIME_CRD, "--ignore-not-found", "-o", "name"]

FAKE_KUBECTL = '''\
#!{python}
"""Stand-in for kubectl with the JobSet and Trainer CRDs of $FAKE_CRDS; records argv."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
crds = [c for c in os.environ.get("FAKE_CRDS", "").split(",") if c]
state = os.environ.get("FAKE_STATE", "Completed")
def obj(kind, name):
    status = {{"conditions": [
        {{"type": "Created", "status": "True", "reason": "JobsCreationSucceeded", "message": "created"}},
        {{"type": state, "status": "True", "reason": "Reason" + state, "message": "rank 3 exit 78"}},
    ]}}
    key = "replicatedJobsStatus" if kind == "JobSet" else "jobsStatus"
    status[key] = [
        {{"name": "rdzv", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}},
        {{"name": "node", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0}},
    ]
    return {{"kind": kind, "metadata": {{"name": name}}, "status": status}}
def pod(name, job, index):
    return {{"metadata": {{"name": name, "labels": {{"jobset.sigs.k8s.io/replicatedjob-name": job}},
                          "annotations": {{"batch.kubernetes.io/job-completion-index": index}}}},
            "status": {{"phase": "Succeeded"}}}}
if args[0] == "create":
    obj_ = json.loads(sys.stdin.read())
    print("secret/%s created" % obj_["metadata"]["name"])
elif args[:2] == ["get", "crd"]:
    for name in args[2:]:
        if name in crds:
            print("customresourcedefinition.apiextensions.k8s.io/" + name)
elif args[0] == "apply":
    print("applied " + args[-1])
elif args[:2] == ["get", "pods"]:
    print(json.dumps({{"items": [pod("r3-rdzv-0-0-aaaaa", "rdzv", "0"), pod("r3-node-0-0-bbbbb", "node", "0"),
                                 pod("r3-node-0-1-ccccc", "node", "1")]}}))
elif args[0] == "get" and "-l" in args and all(r in crds for r in args[1].split(",")):
    run = args[args.index("-l") + 1].split("=")[1]
    kinds = {{"trainjobs.trainer.kubeflow.org": "TrainJob", "jobsets.jobset.x-k8s.io": "JobSet"}}
    print(json.dumps({{"items": [obj(kinds[r], run) for r in args[1].split(",")]}}))
elif args[0] == "get" and args[1] in crds:
    print(json.dumps(obj("JobSet" if args[1].startswith("jobsets") else "TrainJob", args[2])))
elif args[0] == "get" and args[1].startswith(("jobsets", "trainjobs", "clustertrainingruntimes")):
    print('error: the server doesn\\'t have a resource type "%s"' % args[1], file=sys.stderr)
    sys.exit(1)
elif args[0] == "logs":
    print("[trainer] %s step 10/10 loss 1.0" % args[2])
elif args[0] == "get":
    print("NAME   STATUS   AGE\\nr3-node-0-0-bbbbb   Completed   1m")
elif args[0] == "delete":
    print("deleted %s" % " ".join(args[1:3]))
'''


@pytest.fixture
def kubectl_with_crds(tmp_path: Path) -> tuple[str, Path]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(FAKE_KUBECTL.format(python=sys.executable))
    script.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}", tmp_path / "kubectl.log"


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _apply(
    tmp_path: Path,
    outputs_file: Path,
    fake: tuple[str, Path],
    *pairs: str,
    crds: str,
    state: str = "Completed",
):
    path, log = fake
    return run_cli("apply", "RUN_ID=r3", f"OUTPUTS={outputs_file}", *pairs, cwd=tmp_path, path=path,
                   extra_env={"FAKE_LOG": str(log), "FAKE_CRDS": crds, "FAKE_STATE": state})  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "resource", "state", "code"),
    [
        ("jobset", JOBSET_CRD, "Completed", 0),
        ("jobset", JOBSET_CRD, "Failed", 1),
        ("trainjob", TRAINJOB_CRD, "Complete", 0),
        ("trainjob", TRAINJOB_CRD, "Failed", 1),
    ],
)
def test_apply_checks_the_crd_then_applies_and_follows_the_top_object(
    kind: str, resource: str, state: str, code: int, tmp_path: Path, outputs_file: Path, kubectl_with_crds
) -> None:
    proc = _apply(tmp_path, outputs_file, kubectl_with_crds, f"KIND={kind}", crds=ALL_CRDS, state=state)
    assert proc.returncode == code, proc.stdout + proc.stderr
    calls = _calls(kubectl_with_crds[1])
    needed = [JOBSET_CRD] if kind == "jobset" else [TRAINJOB_CRD, RUNTIME_CRD]
    folder = Path("build/k8s/r3")
    assert calls[:4] == [
        ["get", "crd", *needed, "--ignore-not-found", "-o", "name"],
        ["apply", "--server-side", "--field-manager=kit", "-f", str(folder / "00-namespace.yaml")],
        ["create", "-f", "-"],
        ["apply", "--server-side", "--field-manager=kit", "-f", str(folder)],
    ]
    assert calls[4] == ["get", resource, "r3", "-n", "kit-training", "-o", "json"]
    label = {"jobset": "JobSet", "trainjob": "TrainJob"}[kind]
    assert f"{label} r3: 4 pods x 8 processes = world size 32" in proc.stdout
    # the rank-0 log is the trainers' index 0, never the store's (whose index is 0 too)
    logs = [c for c in calls if c[0] == "logs"]
    assert logs == [["logs", "-f", "r3-node-0-0-bbbbb", "-n", "kit-training", "-c", "trainer"]]
    if code == 0:
        assert f"{label} r3 completed; run folder /fsx/runs/r3" in proc.stdout
    else:
        assert f"{label} r3 failed: rank 3 exit 78" in proc.stdout


@pytest.mark.parametrize(
    ("kind", "crds", "missing"),
    [
        ("jobset", "", JOBSET_CRD),
        ("jobset", f"{TRAINJOB_CRD},{RUNTIME_CRD}", JOBSET_CRD),
        ("trainjob", "", TRAINJOB_CRD),
        ("trainjob", f"{JOBSET_CRD},{TRAINJOB_CRD}", RUNTIME_CRD),
    ],
)
def test_a_missing_crd_is_one_line_before_anything_is_applied(
    kind: str, crds: str, missing: str, tmp_path: Path, outputs_file: Path, kubectl_with_crds
) -> None:
    proc = _apply(tmp_path, outputs_file, kubectl_with_crds, f"KIND={kind}", crds=crds)
    assert proc.returncode == 1
    install = "JobSet v0.12" if kind == "jobset" else "Kubeflow Trainer v2.3"
    label = "JobSet" if kind == "jobset" else "TrainJob"
    assert proc.stderr == (
        f"error: KIND={kind}: the cluster serves no {missing} CRD, so a {label} cannot be applied; install "
        f"{install} (deploy the stack with -c kubernetes.job_controllers=true, docs/infra.md) or render KIND=job\n"
    )
    assert [c[:2] for c in _calls(kubectl_with_crds[1])] == [["get", "crd"]]  # nothing applied, no Secret


def test_kind_job_applies_as_before_without_asking_for_crds(
    tmp_path: Path, outputs_file: Path, kubectl_with_crds
) -> None:
    proc = _apply(tmp_path, outputs_file, kubectl_with_crds, "KIND=job", "--no-follow", crds="")
    assert proc.returncode == 0, proc.stderr
    assert [c[0] for c in _calls(kubectl_with_crds[1])] == ["apply", "create", "apply"]
    assert "job r3: 4 pods" in proc.stdout


@pytest.mark.parametrize(
    ("kind", "top"),
    [("jobset", ["06-jobset.yaml"]), ("trainjob", ["06-clustertrainingruntime.yaml", "07-trainjob.yaml"])],
)
def test_dry_run_applies_nothing(
    kind: str, top: list[str], tmp_path: Path, outputs_file: Path, kubectl_with_crds
) -> None:
    proc = _apply(tmp_path, outputs_file, kubectl_with_crds, f"KIND={kind}", "DRY_RUN=1", crds=ALL_CRDS)
    assert proc.returncode == 0, proc.stderr
    assert "DRY_RUN: nothing applied" in proc.stdout
    assert _calls(kubectl_with_crds[1]) == []
    names = sorted(p.name for p in (tmp_path / "build" / "k8s" / "r3").glob("*.yaml"))
    assert names[-len(top) :] == top and "06-job.yaml" not in names


def test_status_shows_the_objects_conditions_beside_the_pods(tmp_path: Path, kubectl_with_crds) -> None:
    path, log = kubectl_with_crds
    env = {"FAKE_LOG": str(log), "FAKE_CRDS": ALL_CRDS, "FAKE_STATE": "Failed"}
    proc = run_cli("status", "RUN_ID=r3", cwd=tmp_path, path=path, extra_env=env)
    assert proc.returncode == 0, proc.stderr
    assert _calls(log) == [
        CRD_QUERY,
        ["get", f"{TRAINJOB_CRD},{JOBSET_CRD}", "-n", "kit-training", "-l", "kit.io/run-id=r3", "-o", "json"],
        ["get", "job,pods", "-n", "kit-training", "-l", "kit.io/run-id=r3", "-o", "wide"],
    ]
    lines = proc.stdout.splitlines()
    assert lines[:3] == [
        "trainjob/r3: Created (JobsCreationSucceeded: created); Failed (ReasonFailed: rank 3 exit 78)",
        "  rdzv: 1 active, 1 ready, 0 succeeded, 0 failed, 0 suspended",
        "  node: 0 active, 0 ready, 1 succeeded, 0 failed, 0 suspended",
    ]
    assert lines[3].startswith("jobset/r3: Created") and "r3-node-0-0-bbbbb   Completed" in proc.stdout
    listing = run_cli("status", cwd=tmp_path, path=path, extra_env=env)
    assert listing.returncode == 0, listing.stderr
    assert _calls(log)[-1] == [
        "get", f"jobs,{TRAINJOB_CRD},{JOBSET_CRD}", "-n", "kit-training", "-l", "app.kubernetes.io/managed-by=kit", "-o", "wide",
    ]  # fmt: skip


def test_status_on_a_cluster_without_the_controllers_shows_the_job(tmp_path: Path, kubectl_with_crds) -> None:
    path, log = kubectl_with_crds
    proc = run_cli("status", "RUN_ID=r3", cwd=tmp_path, path=path, extra_env={"FAKE_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    assert _calls(log) == [
        CRD_QUERY,
        ["get", "job,pods", "-n", "kit-training", "-l", "kit.io/run-id=r3", "-o", "wide"],
    ]


KINDS = "job,deployment,service,configmap,networkpolicy,secret"


def _namespaced(kinds: str) -> list[str]:
    return ["delete", kinds, "-n", "ml", "-l", "kit.io/run-id=r3", "--ignore-not-found", "--wait=false"]


CLUSTER = [
    "delete", "clusterrolebinding,validatingadmissionpolicybinding,validatingadmissionpolicy", "-l",
    "kit.io/run-id=r3", "--ignore-not-found",
]  # fmt: skip


def test_delete_removes_the_top_objects_first_then_the_runs_own_runtime(
    tmp_path: Path, kubectl_with_crds
) -> None:
    path, log = kubectl_with_crds
    env = {"FAKE_LOG": str(log), "FAKE_CRDS": ALL_CRDS}
    proc = run_cli("delete", "RUN_ID=r3", "NAMESPACE=ml", cwd=tmp_path, path=path, extra_env=env)
    assert proc.returncode == 0, proc.stderr
    assert _calls(log) == [
        CRD_QUERY,
        _namespaced(f"{TRAINJOB_CRD},{JOBSET_CRD},{KINDS}"),  # the top objects first: nothing recreates pods
        ["delete", RUNTIME_CRD, "-l", "kit.io/run-id=r3", "--ignore-not-found", "--wait=false"],
        CLUSTER,
    ]
    assert "stay on FSx" in proc.stdout


def test_delete_with_jobset_only_never_names_trainer_resources(tmp_path: Path, kubectl_with_crds) -> None:
    """A resource type the cluster does not serve fails `kubectl delete` even with --ignore-not-found."""
    path, log = kubectl_with_crds
    env = {"FAKE_LOG": str(log), "FAKE_CRDS": JOBSET_CRD}
    proc = run_cli("delete", "RUN_ID=r3", "NAMESPACE=ml", cwd=tmp_path, path=path, extra_env=env)
    assert proc.returncode == 0, proc.stderr
    assert _calls(log) == [CRD_QUERY, _namespaced(f"{JOBSET_CRD},{KINDS}"), CLUSTER]
